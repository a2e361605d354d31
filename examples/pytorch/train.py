"""A small, deterministic DDP training job (CPU, gloo) — mlaunch's PyTorch example.

It runs unchanged under torchrun's env contract (RANK, WORLD_SIZE, MASTER_ADDR...) and
under ModelArts-style arguments (``--init_method tcp://IP:PORT --rank R --world_size W``),
and ignores any other argument a platform appends (``--data_url`` ...).

Fixed seed and synthetic data: the same world size gives bit-identical parameters on every
run, so ``final-checksum`` (printed by rank 0 at the end) compares runs exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--init_method", default=None, help="tcp://HOST:PORT (ModelArts style)")
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--world_size", type=int, default=None)
    args, _unknown = parser.parse_known_args()  # platforms append arguments of their own
    return args


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def batch_for(step: int, rank: int, world: int, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each (step, rank) gets its own slice of an endless synthetic regression stream."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * world + rank)
    x = torch.randn(batch_size, 16, generator=gen)
    w_true = torch.linspace(-1.0, 1.0, 16)
    y = (x @ w_true).unsqueeze(1) + 0.01 * torch.randn(batch_size, 1, generator=gen)
    return x, y


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def main() -> None:
    args = parse_args()
    if args.init_method:
        dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank, world_size=args.world_size)
    else:
        dist.init_process_group("gloo")  # env:// — RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    for step in range(args.steps):
        x, y = batch_for(step, rank, world, args.batch_size, args.seed)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        if rank == 0:
            print(f"step {step} loss {reduced.item() / world:.6f}", flush=True)
    mine = checksum(model.module)
    print(f"param-checksum {mine}", flush=True)
    gathered: list[str | None] = [None] * world
    dist.all_gather_object(gathered, mine)
    if len(set(gathered)) != 1:
        raise SystemExit(f"parameters differ across ranks: {gathered}")
    if rank == 0:
        print(f"final-checksum {mine}", flush=True)
    # Leave together: a rank that tears gloo down while a peer is still closing its
    # connections can abort ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()
    os.environ.get("MLAUNCH_RESTART_COUNT")  # visible to scripts that want to know the attempt


if __name__ == "__main__":
    main()
