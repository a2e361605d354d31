"""DDP as most scripts write it, under mlaunch: the module's own ``state_dict()`` staged every step.

The chaos worker's training (``benchmarks/chaos/worker.py``: DDP over gloo, SGD with momentum, data seeded by step
and rank) with nothing mlaunch-specific but ``Checkpointer.stage``/``save``/``load_latest`` and the stop flag: no
``capture(model=ddp)``, the DDP wrapper is never handed over. With more than two ranks a resume ends bit-identical
to the uninterrupted run only if the restarted DDP reduces its first step with the bucket layout DDP had rebuilt
(``launchers.elastic.ddp_layouts``). Prints what ``tests/trainer_jobs.py`` parses: ``rank R pid P``, ``rank R start
S``, ``rank R step N`` and, on rank 0, ``final-checksum <sha256 of the parameters>``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from launchers import elastic


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--output", default="output/ddp")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    say(f"rank {rank} pid {os.getpid()}")
    guard = elastic.install(quiet=True)
    ckpt = elastic.Checkpointer(args.output)
    torch.manual_seed(1234)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)
    step = 0
    state = ckpt.load_latest()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        step = int(state["step"])
    say(f"rank {rank} start {step}")
    while step < args.steps:
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step * 1000 + rank))
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        optimizer.step()
        step += 1
        snapshot = {"model": model.module.state_dict(), "optim": optimizer.state_dict(), "step": step}
        ckpt.stage(step, snapshot)
        say(f"rank {rank} step {step}")
        stop = guard.should_stop(step)  # every rank, the same step
        if stop or step % args.save_every == 0:
            ckpt.save(step, snapshot)
        if stop:
            guard.exit()
        time.sleep(args.step_time)
    if rank == 0:
        digest = hashlib.sha256()
        for tensor in model.module.state_dict().values():
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        say(f"final-checksum {digest.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
