"""The PyTorch example (examples/pytorch/train.py) under fault injection, for the chaos tests.

The training itself is the example's, unchanged; this wrapper only adds faults, so whatever
survives them is what a user's job survives. Faults are real: signals sent with os.kill,
SIGKILL in the middle of a step or of a shard write.

Env:
  CHAOS_PLAN         faults, ';'-separated, each ``rank:step:action``. They fire in order, once
                     each (CHAOS_STATE records fired ones), at the first step ≥ ``step`` on
                     ``rank`` after the previous one fired — in any attempt or later run.
  CHAOS_STATE        directory for the fired-fault records (required with CHAOS_PLAN)
  CHAOS_STEP_SLEEP   seconds to sleep inside each forward pass (an outside signal lands mid-step)
  CHAOS_SLOW_DYING_SAVE  seconds the dying save's writer sleeps first (slow storage: this
                     wrapper's own ``durable.before_fill`` hook)
  CHAOS_SLOW_SAVE    ``step:seconds``: the same for the (periodic) save of that step, first attempt only

Actions: ``term`` (SIGTERM to itself, mid-step), ``term2`` (two SIGTERMs), ``kill9`` (SIGKILL
itself, mid-step), ``term_launcher`` (SIGTERM to mlaunch, its parent), ``kill9_in_save``
(SIGKILL itself in the middle of writing its shard of the next save), ``hang`` (never finish
the step: the others block in its collective, where no Python handler can run).

Prints ``chaos pid <rank> <pid>`` at start and ``chaos fired <i> <action> rank <r> step <s>``;
with CHAOS_SHOW_ENV (names, ','-separated) also ``chaos env <rank> NAME=value ...`` as the rank sees them.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "pytorch"))

import train  # noqa: E402

from launchers.elastic import checkpoint as _checkpoint  # noqa: E402
from launchers.elastic.format import shardfile  # noqa: E402
from launchers.elastic.storage import durable  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
PLAN = [entry.split(":") for entry in os.environ.get("CHAOS_PLAN", "").split(";") if entry.strip()]
STATE = Path(os.environ["CHAOS_STATE"]) if os.environ.get("CHAOS_STATE") else None
STEP_SLEEP = float(os.environ.get("CHAOS_STEP_SLEEP", "0") or 0)
SLOW_DYING = os.environ.get("CHAOS_SLOW_DYING_SAVE")
SLOW_SAVE = os.environ.get("CHAOS_SLOW_SAVE", "").partition(":")

current = {"step": 0}
armed_in_save: dict[str, Any] = {}


def next_fault() -> tuple[int, int, int, str] | None:
    """(index, rank, step, action) of the first fault not fired yet."""
    if STATE is None:
        return None
    for index, (rank, step, action) in enumerate(PLAN):
        if not (STATE / f"fired_{index}").exists():
            return index, int(rank), int(step), action
    return None


def claim(index: int, action: str) -> bool:
    assert STATE is not None
    try:
        fd = os.open(STATE / f"fired_{index}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{action} rank {RANK} step {current['step']}\n".encode())
    os.close(fd)
    print(f"chaos fired {index} {action} rank {RANK} step {current['step']}", flush=True)
    return True


def on_forward(module: Any, inputs: Any) -> None:
    if STEP_SLEEP:
        time.sleep(STEP_SLEEP)
    fault = next_fault()
    if fault is None:
        return
    index, rank, step, action = fault
    if rank != RANK or current["step"] < step:
        return
    if action == "kill9_in_save":
        if not armed_in_save and claim(index, action):
            armed_in_save["index"] = index
        return
    if not claim(index, action):
        return
    if action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "term2":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term_launcher":
        os.kill(os.getppid(), signal.SIGTERM)
    elif action == "hang":  # stuck for good (the other ranks block in this step's all-reduce)
        while True:
            time.sleep(1)
    else:
        raise SystemExit(f"unknown chaos action {action!r}")


_make_model = train.make_model


def make_model() -> Any:
    model = _make_model()
    model.register_forward_pre_hook(on_forward)
    return model


_capture = train.elastic_torch.capture
_restore = train.elastic_torch.restore


def capture(step: int, **kwargs: Any) -> Any:
    current["step"] = step + 1
    return _capture(step, **kwargs)


def restore(state: Any, **kwargs: Any) -> int:
    start = _restore(state, **kwargs)
    current["step"] = start
    return start


_write_file = shardfile.write_file


def write_file(path: Any, enc: Any, deadline: Any = None) -> int:
    if armed_in_save:
        with open(path, "wb") as fh:  # a real partial shard, then a real SIGKILL
            fh.write(enc.prefix_and_header[: max(1, len(enc.prefix_and_header) // 2)])
            fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return _write_file(path, enc, deadline)


_save = _checkpoint.Checkpointer.save


def save(self: Any, step: int, state: Any, **kwargs: Any) -> Any:
    from launchers.elastic import guard as guard_module

    g = guard_module._guard
    slow_write["seconds"] = 0.0
    if SLOW_DYING and g is not None and g.requested:
        slow_write["seconds"] = float(SLOW_DYING)  # slow storage for the dying save only
    if SLOW_SAVE[2] and int(SLOW_SAVE[0]) == step and os.environ.get("MLAUNCH_RESTART_COUNT", "0") == "0":
        slow_write["seconds"] = float(SLOW_SAVE[2])
    return _save(self, step, state, **kwargs)


slow_write = {"seconds": 0.0}  # how long this rank's next shard write sleeps first (set by ``save``)


def slow_storage() -> None:
    if slow_write["seconds"]:
        time.sleep(slow_write["seconds"])


train.make_model = make_model
train.elastic_torch.capture = capture
train.elastic_torch.restore = restore
shardfile.write_file = write_file
durable.before_fill = slow_storage
_checkpoint.Checkpointer.save = save  # type: ignore[method-assign]
print(f"chaos pid {RANK} {os.getpid()}", flush=True)
if os.environ.get("CHAOS_SHOW_ENV"):
    shown = " ".join(f"{name}={os.environ.get(name, '')}" for name in os.environ["CHAOS_SHOW_ENV"].split(","))
    print(f"chaos env {RANK} {shown}", flush=True)
# The example's DataLoader worker processes stay on (2 per rank): mlaunch's stop signals go to the
# guarded rank, not to them (``progress.mark_guarded``), so every fault here runs with them.
train.main()
