"""Graceful exit that loses nothing — the in-training side (imported by training scripts).

::

    from launchers import elastic
    guard = elastic.install()               # SIGTERM/SIGINT/SIGUSR1 only set a flag; a second signal is ignored
    ckpt = elastic.Checkpointer("output/ckpt")
    state = ckpt.load_latest()              # newest *committed* checkpoint, or None
    for step in range(start, total):
        train_one_step()
        ckpt.stage(step, state_dict)        # optional: copy to shared memory for the agent-side save
        if guard.should_stop(step):         # any rank's signal counts (all_reduce MAX when distributed)
            ckpt.save(step, state_dict)     # every rank writes its shard; rank 0 commits after all are written
            guard.exit()                    # exit code 143

``@elastic.recoverable`` on the function that trains keeps this process through a peer's failure:
the group re-forms around it and the function is called again (``in_place``).

``elastic.finished()`` after the last step tells mlaunch this rank completed: an abort in the
interpreter's teardown afterwards is not a failure (no restart, no flash save, exit code 0).

A script that calls neither ``should_stop`` nor ``stage`` reports progress for mlaunch's hang
detection (``monitor.hang_timeout``) with ``elastic.heartbeat(step)`` once per step.
``with elastic.waiting(): loss.backward()`` tells straggler detection (``monitor.straggler_factor``)
that the time in there is spent waiting for other ranks (DDP's all-reduce), not the rank's own work.

``launchers.elastic.pytorch`` captures and restores model, optimizer, LR scheduler, RNG
states and a data position so a resumed run continues bit-identically;
``launchers.elastic.mindspore`` has an ``ExceptionCheckpoint`` callback.

Importing this package imports neither torch nor MindSpore (standard library only); the
frameworks are used when the script has imported them.

What a script imports stands here (``guard``, ``checkpoint`` with ``resume`` and
``replicated``, ``pytorch``, ``data``, ``ddp_buckets``, ``mindspore``, ``replicas``, ``taskd``,
``integrations``); what serves it has a room of its own below: ``format`` (the shard file and
the checkpoint directory), ``storage`` (bytes made durable), ``ipc`` (the shared-memory files
the rank and mlaunch's agent exchange), ``ranks`` (the rank's environment and collectives),
``dcp`` (the ``torch.distributed.checkpoint`` plug-in). The rooms never import this level
(``tests/test_layout.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launchers.elastic.checkpoint import Checkpointer, CheckpointError
    from launchers.elastic.guard import EXIT_CODE, GracefulExit, Guard, install
    from launchers.elastic.in_place import recoverable
    from launchers.elastic.ipc.completion import finished
    from launchers.elastic.ipc.progress import heartbeat, waiting

__all__ = [
    "EXIT_CODE",
    "CheckpointError",
    "Checkpointer",
    "GracefulExit",
    "Guard",
    "finished",
    "heartbeat",
    "install",
    "recoverable",
    "waiting",
]

# The launcher itself imports ``launchers.elastic.ipc.staging`` (agent-side flash save) on every
# start; loading the checkpoint and guard machinery only when a training script asks for it
# keeps that off mlaunch's start-up time.
_WHERE = {
    "Checkpointer": "checkpoint",
    "CheckpointError": "checkpoint",
    "finished": "ipc.completion",
    "EXIT_CODE": "guard",
    "GracefulExit": "guard",
    "Guard": "guard",
    "install": "guard",
    "recoverable": "in_place",
    "heartbeat": "ipc.progress",
    "waiting": "ipc.progress",
}

# What a rank imports when it calls ``install()`` and makes a ``Checkpointer``, which the facade defers: a
# fresh rank pays ~30 ms of imports on a quiet core for them — ~0.06 s of every restart of 4 ranks on 2 busy
# cores. A standby that preloads ``launchers.elastic`` imports these too (``launchers.standby.standby``).
STANDBY_PRELOAD = (
    "launchers.elastic.guard",
    "launchers.elastic.checkpoint",
    "launchers.elastic.resume",
    "launchers.elastic.replicated",
    "launchers.elastic.ipc.progress",
    "launchers.elastic.ipc.staging",
    "launchers.elastic.ipc.completion",
    # ``@elastic.recoverable`` and what a replacement in an in-place recovery reads its step with: 10 ms of
    # its 50 ms from the hand-off to the training function on 2 busy cores, the longest way to the new group
    "launchers.elastic.in_place",
    "launchers.elastic.ipc.recovery",
    "launchers.elastic.ipc.import_report",
    "launchers.elastic.ipc.kept_segments",
)

if os.environ.get("MLAUNCH_RUN_ID"):  # a rank under mlaunch: its stacks on demand (see ``progress``)
    from launchers.elastic.ipc import progress as _progress

    _progress.install_stack_dump()


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"launchers.elastic.{module}"), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"launchers.elastic.{name}") is not None:
        value = importlib.import_module(f"launchers.elastic.{name}")  # ``elastic.guard``, ``elastic.pytorch``...
    else:
        raise AttributeError(f"module 'launchers.elastic' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
