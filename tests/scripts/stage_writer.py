"""A rank that stages a numpy state every step, as fast as it can (the flash-save tests kill it).

Env: MLAUNCH_RUN_ID, RANK, WORLD_SIZE (and MLAUNCH_SHM_DIR) as under mlaunch; ELEMENTS (int64
count, default 2**20 = 8 MB); STEPS (default: forever); START (first step, default 0);
CKPT_DIR. Every value of the state equals its step, so a torn copy is easy to see. Prints
``staged <step>`` after each completed stage.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from launchers import elastic

elements = int(os.environ.get("ELEMENTS", str(1 << 20)))
steps = int(os.environ.get("STEPS", "-1"))
step = int(os.environ.get("START", "0"))
ckpt = elastic.Checkpointer(os.environ.get("CKPT_DIR", "ckpt"))
buf = np.zeros(elements, dtype=np.int64)
while steps < 0 or step < int(os.environ.get("START", "0")) + steps:
    buf[:] = step
    if not ckpt.stage(step, {"step": step, "w": buf, "tail": [step, str(step)]}):
        sys.exit("staging is off")
    print(f"staged {step}", flush=True)
    step += 1
