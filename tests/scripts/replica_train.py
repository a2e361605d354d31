"""A DDP or FSDP2 job that stages every step and says which state each staged step holds (tests, benchmark).

Why its own script: a machine-loss test must compare the state a resumed job loaded with the
state the old job had at the step it resumed from — a step the ranks only *staged* (mlaunch's
survivors committed it), so the digest of every staged step is printed, not only of saves.

The digest is exact at any world size: every element's float bits times a weight from its
*global* position, summed modulo a prime per key on each rank and all-reduced (integer sums
do not depend on how the tensors are sharded or in which order ranks add). DTensor slices
contribute on the rank that holds them; plain tensors (DDP's replicated model) on rank 0.

Prints (rank 0): ``staged step N: state-digest D step-time T``, ``resumed from step N (saved by
W ranks, now V): state-digest D``, ``final-digest D``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from launchers import elastic

PRIME = 2_147_483_647


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--state-mib", type=float, default=1.0, help="the whole model + AdamW moments (MiB); FSDP2 splits it"
    )
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=256, help="the square layers' width")
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--digest", type=int, default=1, help="print the state digest every step (0: never)")
    parser.add_argument("--init_method", default=None)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--world_size", type=int, default=None)
    args, _ = parser.parse_known_args()
    return args


def make_model(args: argparse.Namespace) -> nn.Module:
    """Square layers sized so that the state (parameters + 2 AdamW moments) is about --state-mib, at any world size."""
    params = args.state_mib * (1 << 20) / 12  # float32 parameters (x3 with the moments)
    width = args.width
    layers = max(1, int(params // (width * width + width)))
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(layers)])


def digest(state: Any, rank: int) -> str:
    """The exact digest of ``state`` (collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for key, value in _leaves(state, ""):
        if isinstance(value, DTensor):
            local = value.to_local()
            offsets = value.__create_chunk_list__()[0].offsets
            row = int(torch.tensor(value.shape[1:]).prod().item()) if value.dim() > 1 else 1
            base = int(offsets[0]) * row if value.dim() else 0
        elif isinstance(value, torch.Tensor) and rank == 0:
            local, base = value, 0
        else:
            continue
        flat = local.detach().reshape(-1).contiguous()
        if flat.numel() == 0:
            continue
        bits = (flat.view(torch.int32) if flat.element_size() == 4 else flat.double().view(torch.int64)).long()
        weights = torch.arange(base, base + flat.numel(), dtype=torch.int64) % 1_000_003 + 1
        part = int(((bits % PRIME) * weights % PRIME).sum().item()) % PRIME
        total = (total + part * (zlib.crc32(key.encode()) % PRIME)) % PRIME
    summed = torch.tensor([total], dtype=torch.int64)
    dist.all_reduce(summed)
    return f"{int(summed.item()) % PRIME:010d}"


def _leaves(obj: Any, where: str) -> Any:
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _leaves(obj[k], f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{where}.{i}")
    else:
        yield where, obj


def main() -> None:
    args = parse_args()
    if args.init_method:
        dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank, world_size=args.world_size)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    model = make_model(args)
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        train: nn.Module = fully_shard(model, mesh=mesh)
    else:
        train = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = elastic.Checkpointer(os.environ.get("MLAUNCH_CHECKPOINT_DIR") or "output/ckpt")
    guard = elastic.install()

    def state() -> dict[str, Any]:
        msd, osd = get_state_dict(model, optimizer)
        return {"model": msd, "optim": osd}

    start = 0
    resumed = state()
    loaded = ckpt.load_latest(into=resumed)
    if loaded is not None:
        set_state_dict(model, optimizer, model_state_dict=resumed["model"], optim_state_dict=resumed["optim"])
        start = loaded + 1
        saved_by = ckpt.loaded.world_size if ckpt.loaded else world
        shown = digest(state(), rank)
        if rank == 0:
            print(
                f"resumed from step {loaded} (saved by {saved_by} ranks, now {world}): state-digest {shown}", flush=True
            )
    width = args.width
    for step in range(start, args.steps):
        began = time.perf_counter()
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(16, width, generator=gen)
        loss = train(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        snapshot = state()
        computed = time.perf_counter()
        # the digest before the stage: every step rank 0 staged has been named (its time is not the step's)
        shown = digest(snapshot, rank) if args.digest and step % args.digest == 0 else "-"
        digested = time.perf_counter()
        ckpt.stage(step, snapshot)
        took = time.perf_counter() - digested + computed - began
        if rank == 0:
            print(f"staged step {step}: state-digest {shown} step-time {took:.4f}", flush=True)
        if guard.should_stop(step):
            ckpt.save(step, state())
            guard.exit()
        if args.save_every and (step + 1) % args.save_every == 0:
            ckpt.save(step, state())
            if rank == 0:
                print(f"saved step {step}", flush=True)
    shown = digest(state(), rank)
    if rank == 0:
        print(f"final-digest {shown}", flush=True)
    ckpt.clear()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
