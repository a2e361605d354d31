"""The last attempt's staged state, kept for the next attempt's ranks after an in-place recovery.

After a peer's failure the surviving ranks (``elastic.recoverable``) and the failed rank's
replacement resume from the newest step every rank staged. mlaunch's flash save commits that step
from the ranks' segments; this module then keeps the segments (renamed) so that the recovering
ranks read their step back from memory instead of the checkpoint directory, which on a platform
is often remote storage (``resume.own_shard``). Both sides import it (stdlib only).

The commit runs beside the recovery (``persist.commit_beside``): mlaunch decides the step while the
ranks are frozen, says it in the *pending* record (``announce_pending``: the step, this node's
ranks' shard sizes, the id the commit will carry, its directory) and wakes them at once; the
re-called ``load_latest()`` takes that step from the kept image even before its marker is on disk
(``pending``). The record says when the commit ended (``ended``): a rank that cannot use its kept
image waits for it (``await_commit``) and reads the file, or falls back with its peers to an older
step. A commit in flight holds the segments it reads open, and mlaunch unlinks kept segments only
after it ended, so they are never released under it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from launchers.elastic.ipc import staging
from launchers.elastic.ranks import env

T = TypeVar("T")


def keep_for_next_attempt(run_id: str) -> int:
    """In-place recovery: this attempt's segments stay, under ``kept_path``, for the next attempt's ranks.

    The recovering ranks read the step every rank staged from them (``read_kept``) instead of the
    checkpoint directory: memory, not storage that may be remote. The flash save committed that
    step from the same bytes first. Renamed, never copied: a survivor's mapping and the agent's
    readers keep their inode; ``run_segments`` (the next attempt's staging) no longer lists them.
    mlaunch retires the last recovery's kept segments before (``run.shm_reclaim``: their pages are
    freed off the path) and removes these with the run (``staging.unlink_kept``). Returns how many were kept.
    """
    kept = 0
    for path in staging.run_segments(run_id):
        rank = path.rsplit(".rank", 1)[1]
        with contextlib.suppress(OSError, ValueError):
            os.rename(path, staging.kept_path(run_id, int(rank)))
            kept += 1
    return kept


def read_kept(run_id: str, rank: int, step: int, length: int, read: Callable[[memoryview], T]) -> T | None:
    """``read`` of rank ``rank``'s staged image of ``step`` in the last attempt's kept segment; None if none.

    ``length``: the committed shard's size (its manifest's): an image of another size is not that
    shard. ``read`` gets the mapped image itself (nobody writes a kept segment: its rank is dead or
    has moved on to a new one), so a tensor is copied once, as from a mapped file; it returns None
    to refuse the image.
    """
    try:
        reader = staging.SegmentReader(staging.kept_path(run_id, rank))
    except (OSError, ValueError):
        return None
    with reader:
        if reader.info.rank != rank:
            return None
        for slot in reader.slots():
            if slot.complete and slot.step == step and slot.length == length:
                view = reader.data(slot)
                try:
                    return read(view)
                finally:
                    view.release()
    return None


PENDING, COMMITTED, FAILED = "pending", "committed", "failed"


def pending_path(run_id: str) -> str:
    """The record of the step mlaunch commits beside an in-place recovery (one per node and run)."""
    return os.path.join(env.shm_dir(), f"mlaunch.{run_id}.pending")


def announce_pending(run_id: str, record: dict[str, Any]) -> None:
    """mlaunch: write the pending record (``state``: ``pending``, then ``committed`` or ``failed``) atomically."""
    path = pending_path(run_id)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, path)


def pending(run_id: str) -> dict[str, Any] | None:
    """The pending record, or None (no commit beside a recovery in this run, or an unreadable record)."""
    if not run_id:
        return None
    try:
        with open(pending_path(run_id)) as fh:
            record: Any = json.load(fh)
        int(record["step"]), str(record["dir"]), dict(record["manifest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return dict(record)


def ended(run_id: str) -> None:
    """The run's pending record goes (with the run, or when no kept segment is left to read)."""
    with contextlib.suppress(OSError):
        os.unlink(pending_path(run_id))


def await_commit(run_id: str, step: int, timeout: float, poll: float = 0.02) -> str | None:
    """Wait until the commit of ``step`` beside the recovery ended; its state (None: no record of that step)."""
    end = time.monotonic() + timeout
    while True:
        record = pending(run_id)
        if record is None or int(record["step"]) != step:
            return None
        if record.get("state") != PENDING or time.monotonic() >= end:
            return str(record.get("state"))
        time.sleep(poll)
