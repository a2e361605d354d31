"""A rank that resumes, saves one step to completion, then starts saving the next (and is killed).

Used by tests/test_kill_during_save.py. Prints, line by line:
``resumed <step|none>``, ``clean <names of step dirs>`` after the first (successful) save,
``saved <step> <seconds>``, then ``saving <step>`` right before the save it will not finish.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from launchers.elastic import Checkpointer
from launchers.elastic.format import layout


def state_of(step: int, size: int) -> dict[str, object]:
    return {"step": step, "w": np.full(size, step, dtype=np.int64), "rng": np.random.RandomState(step).get_state()}


def main() -> None:
    root, size = sys.argv[1], int(sys.argv[2])
    ckpt = Checkpointer(root, keep=2)
    state = ckpt.load_latest()
    step = -1
    if state is not None:
        step = int(state["step"])
        if ckpt.loaded_step != step or not (state["w"] == step).all() or state["w"].shape != (size,):
            print(f"inconsistent {ckpt.loaded_step} {step}", flush=True)
            raise SystemExit(2)
    print(f"resumed {step if state is not None else 'none'}", flush=True)
    started = time.monotonic()
    ckpt.save(step + 1, state_of(step + 1, size))
    print(f"saved {step + 1} {time.monotonic() - started:.4f}", flush=True)
    print("clean " + " ".join(sorted(p.name for p in ckpt.dir.iterdir() if layout.parse_step(p.name))), flush=True)
    print(f"saving {step + 2}", flush=True)
    ckpt.save(step + 2, state_of(step + 2, size))
    print(f"saved {step + 2}", flush=True)
    time.sleep(60)  # the test kills it before or after; it never gets here unkilled for long


if __name__ == "__main__":
    main()
