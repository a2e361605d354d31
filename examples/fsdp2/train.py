"""A small, deterministic FSDP2 training job (CPU, gloo) — mlaunch's sharded-state example.

The model is sharded with ``fully_shard`` (FSDP2: every parameter and every optimizer moment
is a DTensor, each rank holding a slice). Checkpoints go through mlaunch's API with the state
as ``get_state_dict`` returns it — no gathering, each rank writes only its own slices:

- every step is *staged* (``Checkpointer.stage``): copied to shared memory, so if a rank is
  killed (kill -9, a crash) mlaunch itself persists the newest step every rank staged and,
  with ``restart.max_restarts``, restarts the job from it;
- SIGTERM/SIGINT only set a flag; at the next step boundary every rank agrees to stop and
  saves (``Checkpointer.save``), rank 0 commits, and the process exits 143;
- a restart loads the newest committed step *into* the freshly sharded state
  (``Checkpointer.load_latest(into=state)``), whatever world size saved it: DCP's planner
  decides which slices each rank reads. At the same world size the run then ends with the
  same ``final-checksum`` as one that was never interrupted; at another world size it
  continues from the same model (``model-checksum`` at the save and after the load agree)
  and the same position in the data.

``--kill-rank-at R:STEP`` makes rank R SIGKILL itself after staging STEP (first attempt only):
a way to watch the flash save happen.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from launchers import elastic
from launchers.elastic import pytorch as elastic_torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step, to watch a stop land")
    parser.add_argument("--ckpt-dir", default=None, help="default: $MLAUNCH_CHECKPOINT_DIR, else output/ckpt")
    parser.add_argument("--save-every", type=int, default=0, help="also save a checkpoint every N steps (0: off)")
    parser.add_argument(
        "--kill-rank-at",
        default=os.environ.get("FSDP2_KILL_RANK_AT", ""),
        help="R:STEP — rank R kills itself (-9) at STEP, attempt 0 (default: $FSDP2_KILL_RANK_AT)",
    )
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep the checkpoints after the last step")
    parser.add_argument("--init_method", default=None, help="tcp://HOST:PORT (ModelArts style)")
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--world_size", type=int, default=None)
    args, _unknown = parser.parse_known_args()  # platforms append arguments of their own
    return args


class Synthetic(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A fixed regression set: sample i is the same on every run and every rank."""

    def __init__(self, size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, 16, generator=gen)
        self.y = torch.sin(self.x @ torch.linspace(-1.0, 1.0, 16)).unsqueeze(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def make_model(hidden: int, mesh: object) -> nn.Module:
    model = nn.Sequential(nn.Linear(16, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def model_checksum(model: nn.Module) -> str:
    """The whole model's parameters, gathered from every rank's slices (collective)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        digest.update(name.encode() + full.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def saved(ckpt: elastic.Checkpointer, step: int, state: dict[str, object], model: nn.Module, rank: int) -> None:
    """Save (every rank writes its slices) and say which model the checkpoint holds (collective)."""
    ckpt.save(step, state)
    checksum = model_checksum(model)
    if rank == 0:
        print(f"saved step {step}: model-checksum {checksum}", flush=True)


def main() -> None:
    args = parse_args()
    if args.init_method:
        dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank, world_size=args.world_size)
    else:
        dist.init_process_group("gloo")  # env:// — RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    guard = elastic.install()
    ckpt = elastic.Checkpointer(args.ckpt_dir or os.environ.get("MLAUNCH_CHECKPOINT_DIR") or "output/ckpt")
    kill_rank, kill_step = (int(v) for v in args.kill_rank_at.split(":")) if args.kill_rank_at else (-1, -1)
    attempt = int(os.environ.get("MLAUNCH_RESTART_COUNT", "0") or 0)

    torch.manual_seed(args.seed)  # the same initial model on every rank before sharding
    model = make_model(args.hidden, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    torch.manual_seed(args.seed + rank)  # each rank's own noise stream, resumed with the rest
    dataset = Synthetic(1024, args.seed)
    sampler = elastic_torch.ResumableSampler(dataset, rank=rank, num_replicas=world, seed=args.seed)
    loader = elastic_torch.ResumableLoader(  # its own generator: an iterator must not draw from the global stream
        torch.utils.data.DataLoader(
            dataset,
            batch_size=args.batch_size,
            sampler=sampler,
            drop_last=True,
            generator=torch.Generator().manual_seed(args.seed),
        )
    )

    def state() -> dict[str, object]:
        """What a checkpoint holds: the sharded model and optimizer as DCP's state_dict API gives them."""
        msd, osd = get_state_dict(model, optimizer)
        return {
            "model": msd,
            "optim": osd,
            "scheduler": scheduler.state_dict(),
            "data": loader.state_dict(),
            "rng": elastic_torch.rng_state(),
        }

    start = 0
    resumed = state()
    step = ckpt.load_latest(into=resumed)  # filled in place, resharded if another world size saved it
    if step is not None:
        set_state_dict(model, optimizer, model_state_dict=resumed["model"], optim_state_dict=resumed["optim"])
        scheduler.load_state_dict(resumed["scheduler"])
        loader.load_state_dict(resumed["data"])
        elastic_torch.set_rng_state(resumed["rng"])
        start = step + 1
        saved_by = ckpt.loaded.world_size if ckpt.loaded else world
        checksum = model_checksum(model)
        if rank == 0:
            print(f"resumed from step {step} (saved by {saved_by} ranks, now {world}): model-checksum {checksum}")

    batches = iter(loader)
    for step in range(start, args.steps):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        x = x + 0.01 * torch.randn_like(x)  # a little noise from this rank's stream
        loss = nn.functional.mse_loss(model(x), y)
        with elastic.waiting():  # FSDP2's reduce-scatter waits for the slowest rank
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)

        ckpt.stage(step, state())  # mlaunch persists it if this process is killed
        if rank == kill_rank and step == kill_step and attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if guard.should_stop(step):  # any rank's signal: every rank stops here, at the same step
            saved(ckpt, step, state(), model, rank)
            guard.exit()  # 143
        if args.save_every and (step + 1) % args.save_every == 0:
            saved(ckpt, step, state(), model, rank)

    checksum = model_checksum(model)
    if rank == 0:
        print(f"final-checksum {checksum}", flush=True)
    if not args.keep_checkpoints:
        ckpt.clear()  # finished: the resume points are no longer needed
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # leave without interpreter teardown, as the DDP example does


if __name__ == "__main__":
    main()
