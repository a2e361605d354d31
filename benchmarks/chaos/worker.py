"""The training job of a chaos storm (``python -m benchmarks.chaos``): what mlaunch runs on every host.

Deterministic DDP over gloo (CPU): the data of a step are seeded by (step, rank), the state is
the module's and the optimizer's state dicts and the step, so a run that resumes from any
committed step at the same world size ends with the same parameters as one without faults.
Every step is staged (``ckpt.stage``); mlaunch commits staged steps in the background
(``checkpoint.persist_every``); a stop request (SIGTERM, a preemption) saves at the step boundary.

Lines (``os.write``: one write per line, CLOCK_MONOTONIC stamps — one clock for every netns host):

- ``chaos pid RANK PID`` at start;
- ``chaos resumed STEP STAMP WORLD`` (rank 0), the committed step it loaded;
- ``chaos step STEP STAMP`` after every step, on each host's local rank 0;
- ``chaos hanging RANK STAMP`` when asked to hang (a file ``hang-<pid>`` in ``BENCH_HANG_DIR``);
- ``chaos final STEP CHECKSUM`` (rank 0) at the end.

The last step is ``--steps`` or, when the file ``BENCH_END`` holds a number, that number: every rank
reads it each step and they agree on the smallest (one tiny all-reduce), so all stop at the same step.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())


def end_step(path: Path | None, steps: int) -> int:
    if path is None:
        return steps
    try:
        return min(steps, int(path.read_text().strip() or steps))
    except (OSError, ValueError):
        return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--step-time", type=float, default=0.05)
    args, _ = parser.parse_known_args()

    import torch
    import torch.distributed as dist
    from torch import nn

    from launchers import elastic

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    say(f"chaos pid {rank} {os.getpid()}")
    guard = elastic.install(quiet=True)
    ckpt = elastic.Checkpointer(os.environ["BENCH_CKPT_DIR"])
    torch.manual_seed(1234)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)
    start = 0
    state = ckpt.load_latest()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        start = int(state["step"]) + 1
        if rank == 0:
            say(f"chaos resumed {start - 1} {time.monotonic():.6f} {world}")
    elif rank == 0:
        say(f"chaos resumed -1 {time.monotonic():.6f} {world}")
    end_file = Path(os.environ["BENCH_END"]) if os.environ.get("BENCH_END") else None
    hang = Path(os.environ.get("BENCH_HANG_DIR", "/nonexistent"), f"hang-{os.getpid()}")
    step = start
    while True:
        agreed = torch.tensor([end_step(end_file, args.steps)], dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        if step >= int(agreed.item()):
            break
        if hang.exists():
            say(f"chaos hanging {rank} {time.monotonic():.6f}")
            while True:
                time.sleep(1)
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(16, 32, generator=gen)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        optimizer.step()
        if local == 0:
            say(f"chaos step {step} {time.monotonic():.6f}")
        snapshot = {"model": model.module.state_dict(), "optim": optimizer.state_dict(), "step": step}
        ckpt.stage(step, snapshot)
        if guard.should_stop(step):
            ckpt.save(step, snapshot)
            guard.exit()
        time.sleep(args.step_time)
        step += 1
    if rank == 0:
        digest = hashlib.sha256()
        for tensor in model.module.state_dict().values():
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        say(f"chaos final {step - 1} {digest.hexdigest()[:32]}")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
