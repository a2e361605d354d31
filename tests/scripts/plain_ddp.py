"""A DDP job written the way docs/graceful-exit.md shows first: ``state = ckpt.load_latest()``.

Every step is staged (``ckpt.stage``), every ``--save-every`` steps saved, and a SIGTERM stops
every rank at the same step with a save (``guard.should_stop``). The state is what a DDP user
saves — the module's and the optimizer's state dicts and the step — the same on every rank.
``--into`` resumes through ``load_latest(into=state)`` instead (the resharding API).

Rank 0 prints ``saved step N: model-checksum X`` for every save, ``resumed from step N (saved by
V ranks, now W): model-checksum X`` right after loading (the model it loaded), ``step N loss L
model-checksum X`` after every step (what a flash save of that step holds) and, at the end,
``final-checksum X``. The data are fixed (seeded per step and rank), so the
checksums compare runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from launchers import elastic


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.1)
    parser.add_argument("--into", action="store_true", help="resume through load_latest(into=state)")
    args, _ = parser.parse_known_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    guard = elastic.install()
    ckpt = elastic.Checkpointer(os.environ.get("MLAUNCH_CHECKPOINT_DIR") or "output/ckpt")
    torch.manual_seed(1234)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)

    start = 0
    if args.into:
        template = {"model": model.module.state_dict(), "step": -1}
        if ckpt.load_latest(into=template) is not None:
            start = int(template["step"]) + 1
    else:
        state = ckpt.load_latest()
        if state is not None:
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])
            start = int(state["step"]) + 1
    if ckpt.loaded is not None and rank == 0:
        print(
            f"resumed from step {ckpt.loaded_step} ({ckpt.loaded.path}) (saved by {ckpt.loaded.world_size} ranks, "
            f"now {world}): model-checksum {checksum(model.module)}",
            flush=True,
        )
    for step in range(start, args.steps):
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(8, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        time.sleep(args.step_sleep)
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f} model-checksum {checksum(model.module)}", flush=True)
        snapshot = {"model": model.module.state_dict(), "step": step}
        if not args.into:
            snapshot["optim"] = optimizer.state_dict()
        ckpt.stage(step, snapshot)
        stop = guard.should_stop(step)
        if stop or (step + 1) % args.save_every == 0:
            ckpt.save(step, snapshot)
            if rank == 0:
                print(f"saved step {step}: model-checksum {checksum(model.module)}", flush=True)
        if stop:
            guard.exit()
    if rank == 0:
        print(f"final-checksum {checksum(model.module)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
