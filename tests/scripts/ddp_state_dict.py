"""DDP as most scripts write it, under mlaunch: the module's own ``state_dict()`` staged every step.

The chaos worker's training (``benchmarks/chaos/worker.py``: DDP over gloo, SGD with momentum, data seeded by step
and rank) with nothing mlaunch-specific but ``Checkpointer.stage``/``save``/``load_latest`` and the stop flag: no
``capture(model=ddp)``, the DDP wrapper is never handed over. With more than two ranks a resume ends bit-identical
to the uninterrupted run only if the restarted DDP reduces its first step with the bucket layout DDP had rebuilt
(``launchers.elastic.ddp_layouts``). Prints what ``tests/trainer_jobs.py`` parses: ``rank R pid P``, ``rank R start
S``, ``rank R step N`` and, on rank 0, ``final-checksum <sha256 of the parameters>``. ``--loader-workers N``
feeds it from a plain shuffled ``DataLoader`` with N worker processes instead (``plain_loader``).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from launchers import elastic


def say(line: str) -> None:
    os.write(1, f"{line}\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--output", default="output/ddp")
    parser.add_argument(
        "--loader-workers", type=int, default=-1, help="feed a plain DataLoader with this many workers (-1: no loader)"
    )
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
    batches = plain_loader(step, args.loader_workers) if args.loader_workers >= 0 else None
    while step < args.steps:
        if batches is None:
            x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step * 1000 + rank))
        else:
            x = next(batches)
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


def plain_loader(step: int, workers: int) -> Iterator[torch.Tensor]:
    """Batches from step ``step`` on, the way scripts feed DDP: ``DistributedSampler`` (shuffled, its epoch set each
    epoch), a ``DataLoader`` with worker processes, and on resume the epoch's consumed batches skipped."""
    data = torch.randn(96, 32, generator=torch.Generator().manual_seed(7))
    sampler = DistributedSampler(TensorDataset(data), shuffle=True, seed=5, drop_last=True)
    loader = DataLoader(TensorDataset(data), batch_size=4, sampler=sampler, num_workers=workers)
    per_epoch = len(loader)
    epoch, skip = divmod(step, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        for (x,) in itertools.islice(loader, skip, None):
            yield x
        epoch, skip = epoch + 1, 0


if __name__ == "__main__":
    main()
