"""The training job of the fault-recovery benchmarks: what mlaunch or torchrun runs on every rank.

DDP (gloo, CPU) on a small model; every step staged (``ckpt.stage``), so mlaunch's flash save can
commit the newest one when a rank dies. Lines (one ``os.write`` each, CLOCK_MONOTONIC stamps: one
clock for every network-namespace host), read by ``harness.PID`` and ``harness.STEP``:

- ``pid RANK PID`` at start;
- ``step STEP STAMP`` after every step (rank 0);
- ``resumed STEP STAMP`` (``BENCH_ELASTIC``: ``membership.py``) the committed step it loaded;
- ``hanging RANK STAMP`` when asked to hang (a file ``hang-<rank>`` in ``BENCH_HANG_DIR``: ``hosts.py``);
- ``mark NAME RANK STAMP`` (``BENCH_PHASES=1``: ``fault_recovery.py --phases``) when each rank's training function
  began (``call``), its process group formed (``group``), its DDP model was built (``ddp``), its state loaded
  (``loaded``).

``BENCH_IN_PROCESS=1`` runs the training under ``@elastic.recoverable``; ``BENCH_FRESH_PREFIX``
gives gloo a key prefix per restart (torchrun reuses its store across restarts).

    python benchmarks/recovery/worker.py --step-time 0.02    # (what the launchers run)
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def say(line: str) -> None:
    """One write per line: under torchrun all workers share one stdout, and print() writes the
    text and the newline separately, so lines of different ranks could run together."""
    os.write(1, f"{line}\n".encode())


def mark(name: str, rank: int | str = "-") -> None:
    if os.environ.get("BENCH_PHASES") == "1":
        say(f"mark {name} {rank} {time.monotonic():.6f}")


def worker(step_time: float) -> None:
    if os.environ.get("BENCH_IN_PROCESS") == "1":
        from launchers import elastic

        elastic.recoverable(train)(step_time)
    else:
        train(step_time)


def train(step_time: float) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from launchers import elastic

    mark("call", os.environ.get("RANK", "-"))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("BENCH_FRESH_PREFIX") in ("1", "round"):
        # torchrun reuses its store across restarts and gloo then reads the previous group's
        # addresses ("connectFullMesh failed"); a key prefix per restart avoids that
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]), is_master=False
        )
        if os.environ["BENCH_FRESH_PREFIX"] == "round":  # several torchruns: their restart counts can differ
            restart = f"round-{rendezvous_round()}"
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"bench-restart-{restart}/", store),
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    mark("group", rank)
    say(f"pid {rank} {os.getpid()}")
    guard = elastic.install(quiet=True)
    ckpt = elastic.Checkpointer(os.environ.get("BENCH_CKPT_DIR"), keep=1)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mark("ddp", rank)
    start = 0
    if os.environ.get("BENCH_ELASTIC"):  # membership.py: the world size changes, so load into the state
        into = {"step": -1, "model": model.module.state_dict()}  # filled in place (the parameters themselves)
        if ckpt.load_latest(into=into) is not None:
            start = int(into["step"]) + 1
            say(f"resumed {start - 1} {time.monotonic():.6f}")
    elif (state := ckpt.load_latest()) is not None:
        model.module.load_state_dict(state["model"])
        start = int(state["step"]) + 1
    mark("loaded", rank)
    step = start
    hang = Path(os.environ.get("BENCH_HANG_DIR", "/nonexistent"), f"hang-{rank}")
    while True:
        if hang.exists():  # hosts.py asks this rank to hang inside a step
            hang.unlink()
            say(f"hanging {rank} {time.monotonic():.6f}")
            while True:
                time.sleep(1)
        x = torch.randn(32, 64)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if rank == 0:
            say(f"step {step} {time.monotonic():.6f}")  # CLOCK_MONOTONIC: one clock for every netns host
        ckpt.stage(step, {"step": step, "model": model.module.state_dict()})
        if guard.should_stop(step):
            guard.exit()
        time.sleep(step_time)
        step += 1


def rendezvous_round() -> int:
    """The c10d rendezvous round of this group: the same on every host, new on every restart.

    The workers' store (the agents' shared TCPStore) outlives the rounds and holds no round
    number; the rendezvous store at ``BENCH_RDZV_ENDPOINT`` (torchrun's ``--rdzv-endpoint``) keeps
    the rendezvous state (pickled, base64) under ``torch.rendezvous.<run id>``.
    """
    import base64
    import pickle

    import torch.distributed as dist

    host, port = os.environ["BENCH_RDZV_ENDPOINT"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False)
    raw = store.get(f"torch.rendezvous.{os.environ['TORCHELASTIC_RUN_ID']}")
    return int(pickle.loads(base64.b64decode(raw)).round)  # noqa: S301 - torch's own state, our own store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-time", type=float, default=0.02)
    args, _ = parser.parse_known_args()
    worker(args.step_time)


if __name__ == "__main__":
    main()
