"""A DDP job under ``@elastic.recoverable``, written as docs/in-place-recovery.md shows it.

The training function is the ordinary one (``init_process_group``, ``load_latest()``, the loop); the
decorator calls it again in the same process when a peer fails. Every step is staged; the data are
fixed per step and rank, so the final checksum compares runs. Each rank appends ``pid step`` lines
to ``$IN_PLACE_LOG/rank<R>`` (which process trained which step) and, rank 0 only, prints
``final-checksum X``. ``--fault kill|hang`` makes rank ``--victim`` kill -9 or SIGSTOP itself at step
``--at`` once per job (a marker file next to the log records that it happened; ``--at 15,20``: once at
each); ``--keep`` leaves the
checkpoints where they are at the end (the test reads what was committed). ``IN_PLACE_DEAF=R``: rank R
sleeps at the fault's step (once a job), a wait its watcher's shut-down connections cannot end.
``IN_PLACE_BUSY=R``: rank R computes (burns CPU) for ``IN_PLACE_BUSY_S`` seconds at the fault's step
(once a job), then meets its next collective as a long step's compute would. ``IN_PLACE_ORPHAN=1``: the
victim first starts ``sleep 600`` in a session of its own, its pid in ``orphan`` beside the log: an
orphan its death leaves to mlaunch.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

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


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--fault", choices=["none", "kill", "hang"], default="none")
    parser.add_argument("--victim", default="2", help="the rank that fails; several: 1,3 (each at every --at)")
    parser.add_argument("--at", default="20", help="the step of the fault; several: 15,20 (one fault each)")
    parser.add_argument("--keep", action="store_true", help="leave the checkpoints (no ckpt.clear() at the end)")
    args, _ = parser.parse_known_args()
    return args


def fake_device() -> None:
    """``IN_PLACE_FAKE_CUDA=1`` (``tests/test_standby_device.py``): take this rank's GPU as a script does, on the
    test's stand-in for CUDA, and record which contexts the process had when this call began."""
    import fake_cuda

    local, had = int(os.environ["LOCAL_RANK"]), fake_cuda.contexts()
    torch.cuda.set_device(local)
    with open(Path(os.environ["IN_PLACE_LOG"]) / f"cuda{local}", "a") as fh:
        fh.write(f"{os.getpid()} {had} {fake_cuda.contexts()}\n")


def stall_once() -> None:
    """``IN_PLACE_STALL=R``: rank R, called again after a recovery in place, blocks before it rejoins (once a job)."""
    from launchers.elastic import in_place

    marker = Path(os.environ["IN_PLACE_LOG"]) / "stalled"
    if os.environ.get("RANK") == os.environ.get("IN_PLACE_STALL") and in_place.recoveries and not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(600)


@elastic.recoverable
def train(args: argparse.Namespace) -> None:
    if os.environ.get("IN_PLACE_FAKE_CUDA") == "1":
        fake_device()
    stall_once()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ckpt = elastic.Checkpointer()
    torch.manual_seed(1234)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    start = 0
    state = ckpt.load_latest()
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        start = int(state["step"]) + 1
    log = Path(os.environ["IN_PLACE_LOG"])
    faults = {int(at) for at in str(args.at).split(",")}
    victims = {int(v) for v in str(args.victim).split(",")}
    for step in range(start, args.steps):
        marker = log / ("fault-done" if len(faults) == 1 else f"fault-done-{step}")
        if len(victims) > 1:
            marker = marker.with_name(f"{marker.name}-rank{rank}")
        deaf = log / "deaf-done"
        if os.environ.get("IN_PLACE_DEAF") == str(rank) and step in faults and not deaf.exists():
            deaf.write_text(str(os.getpid()))  # a wait no shut-down connection ends (once a job): see the test
            time.sleep(600)
        busy = log / "busy-done"
        if os.environ.get("IN_PLACE_BUSY") == str(rank) and step in faults and not busy.exists():
            busy.write_text(str(os.getpid()))  # computing, not waiting: it leaves at its next collective
            until = time.monotonic() + float(os.environ.get("IN_PLACE_BUSY_S", "3"))
            while time.monotonic() < until:
                sum(i * i for i in range(10_000))
        if args.fault != "none" and rank in victims and step in faults and not marker.exists():
            marker.write_text(str(os.getpid()))
            if os.environ.get("IN_PLACE_ORPHAN"):
                orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)  # outside the rank's group
                (log / "orphan").write_text(str(orphan.pid))
            os.kill(os.getpid(), signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(8, 16, generator=gen)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        ckpt.stage(step, {"model": model.module.state_dict(), "optim": optimizer.state_dict(), "step": step})
        with open(log / f"rank{rank}", "a") as fh:
            fh.write(f"{os.getpid()} {step} {time.time():.6f}\n")
        time.sleep(args.step_sleep)
    if rank == 0:
        print(f"final-checksum {checksum(model.module)}", flush=True)
    if not args.keep:
        ckpt.clear()
    elastic.finished()


if __name__ == "__main__":
    # IN_PLACE_OFF=1: the same function without the decorator (every fault restarts every rank)
    (train.__wrapped__ if os.environ.get("IN_PLACE_OFF") == "1" else train)(arguments())  # type: ignore[attr-defined]
