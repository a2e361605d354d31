"""A DDP job grown from 2 ranks to 3 sets the same gradient bucket layout on every rank.

``python ddp_grow_layout.py DIR`` trains 3 steps with 2 gloo ranks on loopback (DDP, default buckets), saves the
module's ``state_dict()`` with ``Checkpointer.save``, then starts 3 ranks that ``load_latest()`` it and take one
step; each of those prints one JSON line: its rank and the bucket layout its reducer reduced that step with. The
new rank 2 has no shard of its own: it must still set the layout the others read.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from launchers import elastic
from launchers.elastic import ddp_buckets


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build() -> nn.parallel.DistributedDataParallel:
    torch.manual_seed(1234)
    return nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1)))


def step(model: nn.Module, optimizer: torch.optim.Optimizer, n: int) -> None:
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(n * 100 + dist.get_rank()))
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def rank_main(rank: int, world: int, port: int, directory: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = elastic.Checkpointer(directory)
    state = ckpt.load_latest()
    if state is None:
        for n in range(3):
            step(model, optimizer, n)
        ckpt.save(3, {"model": model.module.state_dict()})
    else:
        model.module.load_state_dict(state["model"])
        step(model, optimizer, 3)
        print(json.dumps({"rank": rank, "layout": ddp_buckets.current_layout(model)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    directory = sys.argv[1]
    for world in (2, 3):
        mp.spawn(rank_main, args=(world, free_port(), directory), nprocs=world, join=True)
    assert Path(directory).is_dir()


if __name__ == "__main__":
    main()
