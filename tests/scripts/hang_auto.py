"""Four ranks in lock step over gloo, for ``hang_timeout: auto`` (``tests/test_hang_auto.py``).

Each step reports progress (``elastic.heartbeat``), sleeps ``STEP_TIME`` and all-reduces — not
wrapped in ``elastic.waiting()``, as in the issue's run — so only the stacks can tell a waiting rank.

Env: STEPS, STEP_TIME (seconds); SLOW_EVERY: every that many steps an evaluation (every rank loops
over small batches) and a checkpoint (rank 0 writes in chunks while the others wait in a barrier),
each ``SLOW_FACTOR`` × STEP_TIME; STOP_RANK / STOP_STEP: that rank SIGSTOPs itself at that step.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from launchers import elastic

dist.init_process_group("gloo")
rank = dist.get_rank()
steps, step_time = int(os.environ["STEPS"]), float(os.environ["STEP_TIME"])
slow_every, slow = int(os.environ.get("SLOW_EVERY", "0")), float(os.environ.get("SLOW_FACTOR", "10")) * step_time
stop_rank, stop_step = int(os.environ.get("STOP_RANK", "-1")), int(os.environ.get("STOP_STEP", "-1"))
total = torch.ones(1)


def evaluate(seconds: float) -> None:
    """Small batches for ``seconds``: the main thread runs Python between them, reports nothing."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))
        time.sleep(0.02)


def checkpoint(seconds: float, step: int) -> None:
    """Rank 0 writes chunks for ``seconds`` (each write a little wait); the others wait in a barrier."""
    if rank == 0:
        end = time.monotonic() + seconds
        with open(os.path.join(os.environ["OUT_DIR"], f"ckpt-{step}"), "wb") as fh:
            while time.monotonic() < end:
                fh.write(b"x" * 4096)
                time.sleep(0.05)
    dist.barrier()


for step in range(steps):
    elastic.heartbeat(step)
    if rank == stop_rank and step == stop_step:
        print(f"rank {rank} stops itself at step {step} at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    if slow_every and step and step % slow_every == 0:
        print(f"step {step}: evaluation and checkpoint, {slow:.1f}s each", flush=True)
        evaluate(slow)
        checkpoint(slow, step)
    time.sleep(step_time)
    dist.all_reduce(total)
dist.destroy_process_group()
print(f"rank {rank} finished", flush=True)
