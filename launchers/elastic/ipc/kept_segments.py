"""The last attempt's staged state, kept for the next attempt's ranks after an in-place recovery.

After a peer's failure the surviving ranks (``elastic.recoverable``) and the failed rank's
replacement resume from the newest step every rank staged. mlaunch's flash save commits that step
from the ranks' segments; this module then keeps the segments (renamed) so that the recovering
ranks read their step back from memory instead of the checkpoint directory, which on a platform
is often remote storage (``resume.own_shard``). Both sides import it (stdlib only).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TypeVar

from launchers.elastic.ipc import staging

T = TypeVar("T")


def keep_for_next_attempt(run_id: str) -> int:
    """In-place recovery: this attempt's segments stay, under ``kept_path``, for the next attempt's ranks.

    The recovering ranks read the step every rank staged from them (``read_kept``) instead of the
    checkpoint directory: memory, not storage that may be remote. The flash save committed that
    step from the same bytes first. Renamed, never copied: a survivor's mapping and the agent's
    readers keep their inode; ``run_segments`` (the next attempt's staging) no longer lists them.
    mlaunch removes them after the next attempt and with the run (``staging.unlink_kept``).
    Returns how many were kept.
    """
    staging.unlink_kept(run_id)
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
