"""The PyTorch example with an injected fault: rank FAULT_RANK SIGKILLs itself at step FAULT_STEP.

With FAULT_ONCE=1 the fault happens only on the first attempt (MLAUNCH_RESTART_COUNT=0), so a
restart must succeed. Used by the end-to-end tests; the example itself stays fault-free.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "pytorch"))

import torch.distributed as dist  # noqa: E402
import train  # noqa: E402

fault_rank = int(os.environ.get("FAULT_RANK", "1"))
fault_step = int(os.environ.get("FAULT_STEP", "3"))
once = os.environ.get("FAULT_ONCE") == "1"
original_all_reduce = dist.all_reduce
calls = {"n": 0}


def all_reduce_with_fault(*args, **kwargs):  # type: ignore[no-untyped-def]
    calls["n"] += 1
    first_attempt = os.environ.get("MLAUNCH_RESTART_COUNT", "0") == "0"
    if dist.get_rank() == fault_rank and calls["n"] > fault_step and (first_attempt or not once):
        os.kill(os.getpid(), signal.SIGKILL)
    return original_all_reduce(*args, **kwargs)


train.dist.all_reduce = all_reduce_with_fault  # the loss all_reduce, once per step
train.main()
