"""The process-wide staging segment of a worker started by mlaunch: found once, switched off once.

A rank has one segment (``staging.Segment``) for as long as it lives; every stager (the
``Checkpointer``, the DCP plug-in, the trainers' integrations) and the status reports of the
guard and the saves reach it through here, so that a full ``/dev/shm`` turns staging off in
one place, said once, for all of them.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from launchers.elastic.ipc import staging
from launchers.elastic.ranks import env
from launchers.log import say

_segment: staging.Segment | None = None
_disabled_reason: str | None = None


def process_segment(rank: int, world: int) -> staging.Segment | None:
    """This worker's segment, or None when not run by mlaunch (no agent would read it) or disabled."""
    global _segment
    if _disabled_reason is not None:
        return None
    run_id = env.run_id()
    if not run_id:
        return None
    if _segment is None or _segment.rank != rank:
        attempt = env.attempt()
        _segment = staging.Segment(staging.segment_path(run_id, rank), rank, world, attempt)
    return _segment


def disable(reason: str) -> None:
    """Stop staging in this process (e.g. /dev/shm is too small) and say so once."""
    global _disabled_reason, _segment
    if _disabled_reason is None:
        _disabled_reason = reason
        say(f"staging to shared memory is off: {reason}", who="mlaunch.elastic")
    if _segment is not None:
        _segment.close()
        with contextlib.suppress(OSError):
            os.unlink(_segment.path)
        _segment = None


def reopen() -> None:
    """This process joins a new attempt in place (``elastic.recoverable``): its next stage makes a new segment.

    mlaunch removed the old attempt's segment file (its agent persisted what it held); the mapping goes too.
    """
    global _segment
    if _segment is not None:
        with contextlib.suppress(OSError, ValueError, BufferError):
            _segment.close()
        _segment = None


def forget(rank: int, world: int) -> None:
    """Drop what this process staged (after ``Checkpointer.clear()``: training is over)."""
    seg = process_segment(rank, world)
    if seg is not None:
        with contextlib.suppress(OSError, ValueError):
            seg.forget()


def update_status(rank: int, world: int, **fields: Any) -> None:
    """Record status for mlaunch's grace-budget monitor (no-op when not under mlaunch)."""
    seg = process_segment(rank, world)
    if seg is None:
        return
    try:
        status = seg.status() if seg._mm is not None else staging.Status()
        for name, value in fields.items():
            setattr(status, name, value)
        seg.set_status(status)
    except (OSError, ValueError) as exc:
        disable(str(exc))
