"""Segments between two attempts: renamed out of the way at once, their pages freed on a thread (``run.shm_reclaim``).

Real files in a per-test ``MLAUNCH_SHM_DIR`` (tmpfs frees a file's pages in the unlink that drops
its last name: 0.16 s per GiB here, what used to sit between an attempt's end and the next start).
The recovery's own measure is ``benchmarks/fault_recovery.py --in-process``; the end-to-end case
(nothing of a run left in shared memory after it) is in ``tests/test_in_place.py``.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from launchers.elastic.ipc import kept_segments, staging
from launchers.run.shm_reclaim import ShmReclaim, retire

RUN = "0123456789abcdef0123456789abcdef"


def segment(path: str, fill: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(fill * 4096)


def test_retired_segments_free_their_names_at_once_and_a_reader_keeps_its_bytes(shm: Path) -> None:
    for rank in (0, 1):
        segment(staging.kept_path(RUN, rank), b"k")
        segment(staging.segment_path(RUN, rank), b"s")
    with open(staging.kept_path(RUN, 0), "rb") as fh:  # a reader that mapped the last recovery's segment
        reading = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    retired = retire(sorted(staging.kept_segments(RUN)))
    assert len(retired) == 2 and not staging.kept_segments(RUN)  # the names are free for this attempt's kept ones
    assert kept_segments.keep_for_next_attempt(RUN) == 2  # renamed into place: nothing replaced, nothing freed
    assert sorted(staging.kept_segments(RUN)) == sorted(staging.kept_path(RUN, r) for r in (0, 1))
    assert not staging.run_segments(RUN)  # no reader lists a retired name
    assert reading[:1] == b"k" and len(reading) == 4096  # the mapping still reads the retired inode
    reclaim = ShmReclaim()
    reclaim.unlink(retired)
    reclaim.wait()
    assert not any(os.path.exists(path) for path in retired)
    assert reading[-1:] == b"k"  # unlinked, not truncated: a reader's pages go with its mapping
    reading.close()
    assert sorted(p.name for p in shm.iterdir()) == sorted(os.path.basename(staging.kept_path(RUN, r)) for r in (0, 1))


def test_retired_names_a_killed_mlaunch_left_are_removed_with_the_run(shm: Path) -> None:
    """mlaunch SIGKILLed before its reclaim thread ran: the watchdog's ``unlink_run`` removes them too."""
    segment(staging.segment_path(RUN, 0), b"s")
    retired = retire(staging.run_segments(RUN))
    assert [p.name for p in shm.iterdir()] == [os.path.basename(retired[0])]
    assert staging.unlink_run(RUN) == 1 and not list(shm.iterdir())
