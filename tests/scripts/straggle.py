"""A lock-step gloo job where one rank turns slow for a while (a straggler appears, then recovers).

Every step each rank does a little work (``STRAGGLE_STEP`` seconds) and then
``guard.should_stop(step)`` — one all-reduce, so every rank waits for the slowest each step
and all ranks step at the same rate. Rank ``STRAGGLE_RANK`` sleeps ``STRAGGLE_SLEEP`` more
seconds per step during steps [``STRAGGLE_FROM``, ``STRAGGLE_TO``). Prints ``done <rank> <step>``.
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

from launchers import elastic


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STRAGGLE_STEPS", "120"))
    work = float(os.environ.get("STRAGGLE_STEP", "0.03"))
    slow_rank = int(os.environ.get("STRAGGLE_RANK", "-1"))
    slow = float(os.environ.get("STRAGGLE_SLEEP", "0.25"))
    first, last = int(os.environ.get("STRAGGLE_FROM", "20")), int(os.environ.get("STRAGGLE_TO", "40"))
    guard = elastic.install()
    step = 0
    for step in range(steps):
        time.sleep(work + (slow if rank == slow_rank and first <= step < last else 0.0))
        if guard.should_stop(step):
            guard.exit()
    print(f"done {rank} {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
