"""Why a DDP job resumed from its module's ``state_dict()`` ends in other bits than its uninterrupted twin.

``python ddp_first_step.py WORLD`` runs WORLD processes (gloo on loopback, one machine) that each train the chaos
worker's model (``benchmarks/chaos/worker.py``: DDP, SGD with momentum, data seeded by step and rank) three ways
in one process group and print, from rank 0, one JSON line:

- ``uninterrupted``: 6 steps, one DDP;
- ``resumed``: 3 steps, then the module's and optimizer's ``state_dict()`` loaded into a fresh model, optimizer
  and DDP (what a restarted process does), then 3 more steps;
- ``resumed_with_layout``: the same, the fresh DDP given the old one's gradient bucket layout
  (``launchers.elastic.ddp_buckets``) before its first step;

with the sha256 of the final parameters of each, whether the state loaded equals the state saved bit for bit, and
DDP's bucket layouts: the constructor's (parameter indices per bucket, reduction order) and the one it rebuilt
after its first iteration. With more than two ranks gloo's allreduce sums an element in an order that depends on
its offset in the bucket, so the layout decides the last bits of the gradients.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from launchers.elastic import ddp_buckets


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for tensor in model.state_dict().values():
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def build() -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    torch.manual_seed(1234)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)))
    return model, torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)


def current_layout(model: DistributedDataParallel) -> list[list[int]]:
    index = {id(p): i for i, p in enumerate(model._build_params_for_reducer()[0])}
    return [[index[id(p)] for p in b.parameters()] for b in model.reducer._get_zeros_like_grad_buckets()]


def train(model: DistributedDataParallel, optimizer: torch.optim.Optimizer, steps: range) -> None:
    rank = dist.get_rank()
    for step in steps:
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(step * 1000 + rank))
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        optimizer.step()


def resumed(with_layout: bool) -> tuple[str, bool]:
    model, optimizer = build()
    train(model, optimizer, range(3))
    layout = ddp_buckets.layout(model)  # collective once: the rebuild DDP's next forward would run
    saved = {"model": model.module.state_dict(), "optim": optimizer.state_dict()}
    saved = {k: {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in s.items()} for k, s in saved.items()}
    fresh, fresh_optimizer = build()  # the restarted process
    fresh.module.load_state_dict(saved["model"])
    fresh_optimizer.load_state_dict(saved["optim"])
    exact = all(
        torch.equal(a, b)
        for a, b in zip(model.module.state_dict().values(), fresh.module.state_dict().values(), strict=True)
    )
    if with_layout and layout is not None:
        ddp_buckets.set_layout(fresh, layout)
    train(fresh, fresh_optimizer, range(3, 6))
    return digest(fresh), exact


def run(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model, optimizer = build()
    constructed = current_layout(model)
    train(model, optimizer, range(6))
    result = {
        "world": world,
        "uninterrupted": digest(model),
        "constructor_layout": constructed,
        "rebuilt_layout": current_layout(model),
    }
    result["resumed"], result["loaded_exact"] = resumed(with_layout=False)
    result["resumed_with_layout"], _ = resumed(with_layout=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(run, args=(world, os.path.join(tmp, "store"), out), nprocs=world)
        print(Path(out).read_text())


if __name__ == "__main__":
    main()
