"""Ranks in lock step over gloo; in attempt ``a`` rank ``HANG_ORDER[a]`` sleeps in its own code.

The hang issue 25 is about: one rank stuck outside any collective (here ``time.sleep`` at step
``HANG_STEP``, the line marked SLEEPS HERE) while its peers block in the next all-reduce, which
they wrap in ``elastic.waiting()`` as the PyTorch example wraps DDP's backward. mlaunch must name
the sleeping rank first. Attempts past the order run ``STEPS`` steps and exit 0.

Env: HANG_ORDER (comma-separated ranks, one per attempt), HANG_STEP (default 3), STEPS (default 20).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from launchers import elastic

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("MLAUNCH_RESTART_COUNT", "0"))
order = [int(r) for r in os.environ["HANG_ORDER"].split(",")]
sleeper = order[attempt] if attempt < len(order) else -1
hang_step = int(os.environ.get("HANG_STEP", "3"))
total = torch.ones(1)
for step in range(int(os.environ.get("STEPS", "20"))):
    elastic.heartbeat(step)
    if rank == sleeper and step == hang_step:
        print(f"round {attempt}: rank {rank} sleeps at step {step}", flush=True)
        time.sleep(3600)  # SLEEPS HERE: its own code, not a collective
    with elastic.waiting():  # the peers block here, in the all-reduce the sleeper never joins
        dist.all_reduce(total)
    time.sleep(0.02)
dist.destroy_process_group()
print(f"rank {rank} finished", flush=True)
