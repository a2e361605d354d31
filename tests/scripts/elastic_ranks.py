"""One rank of a small gloo job exercising launchers.elastic (started by the tests, N at a time).

Usage: elastic_ranks.py MODE CKPT_DIR   with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set
(``NO_DIST=1``: no process group, only RANK/WORLD_SIZE).

Modes:
  save    save step $STEP (or each of "1,2,...", in one job) of a state whose size is $BYTES_<rank>
          (or $BYTES, default 4096) bytes; prints ``saved <path>`` or ``save failed: <error>`` (exit 3)
  load    load_latest; prints ``loaded <step> <sha256 of the tensor bytes>`` or ``loaded none``,
          or ``load failed: <error>`` (exit 4)
($REPLICATED=1: every rank saves the same state, as data-parallel training does; $CKPT_DIR_<rank>:
that rank's directory instead of CKPT_DIR.)
  guard   install the guard and run steps (each $STEP_TIME s); rank $SIGNAL_RANK sends itself
          SIGTERM at step $SIGNAL_STEP; prints ``stop <step>`` where it stops, saves, exits 143
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from launchers import elastic


def state_for(rank: int, step: int) -> dict[str, object]:
    if os.environ.get("REPLICATED") == "1":  # data parallel: the same values on every rank
        gen = torch.Generator().manual_seed(step)
        return {"step": step, "w": torch.randint(0, 255, (4096,), dtype=torch.uint8, generator=gen)}
    size = int(os.environ.get(f"BYTES_{rank}", os.environ.get("BYTES", "4096")))
    gen = torch.Generator().manual_seed(rank * 1000 + step)
    return {"step": step, "rank": rank, "w": torch.randint(0, 255, (size,), dtype=torch.uint8, generator=gen)}


def digest(state: dict[str, object]) -> str:
    tensor = state["w"]
    assert isinstance(tensor, torch.Tensor)
    return hashlib.sha256(tensor.numpy().tobytes()).hexdigest()[:16]


def main() -> int:
    mode, ckpt_dir = sys.argv[1], sys.argv[2]
    if os.environ.get("NO_DIST") != "1":
        dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    ckpt_dir = os.environ.get(f"CKPT_DIR_{rank}", ckpt_dir)  # a rank whose node sees another directory
    ckpt = elastic.Checkpointer(ckpt_dir, keep=int(os.environ.get("KEEP", "3")))
    code = 0
    if mode == "save":
        try:
            for step in [int(s) for s in os.environ.get("STEP", "1").split(",")]:  # one job's saves, in order
                path = ckpt.save(step, state_for(rank, step))
                print(f"saved {path}", flush=True)
        except elastic.CheckpointError as exc:
            # every rank gets here together (the save fails on all of them), so the group still
            # ends cleanly: a gloo group left to the interpreter's exit while a peer is already
            # gone can abort the process (SIGABRT) instead of exiting 3
            print(f"save failed: {exc}", flush=True)
            code = 3
    elif mode == "load":
        try:
            state = ckpt.load_latest()
            print(f"loaded {state['step']} {digest(state)}" if state else "loaded none", flush=True)
        except elastic.CheckpointError as exc:  # raised on every rank alike: the group still ends cleanly
            print(f"load failed: {exc}", flush=True)
            code = 4
    elif mode == "guard":
        guard = elastic.install()
        signal_rank = int(os.environ.get("SIGNAL_RANK", "-1"))
        signal_step = int(os.environ.get("SIGNAL_STEP", "3"))
        step_time = float(os.environ.get("STEP_TIME", "0.05"))
        for step in range(1000):
            time.sleep(step_time)
            if rank == signal_rank and step == signal_step:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
            if guard.should_stop(step):
                print(f"stop {step}", flush=True)
                ckpt.save(step, state_for(rank, step))
                guard.exit()
        return 1
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
