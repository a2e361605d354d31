"""A rank's staging segment re-created (its state grew) never shrinks under mlaunch's mapping of it.

mlaunch's agent maps each rank's segment (``staging.SegmentReader``: the grace budget, the
standby pool's "staged yet?" poll, the flash save). A mapping whose file shrinks kills the
process that touches it with SIGBUS — not an exception, the whole mlaunch. A 300-fault storm
(``python -m benchmarks.chaos`` seed 37) lost node 0's mlaunch to signal 7 at the first step of an
attempt, while the standby pool polled the segments: the segment used to be re-created in place
(``O_TRUNC``, then grown), so for a moment the file was empty under the agent's mapping.

Real segments in a per-test directory, real mappings, a real SIGBUS in a child process: the
child reads its mapping at the moment the rank's re-creation sizes the new file (``os.ftruncate``
wrapped to read first) — the moment the old code had the file at 0 bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from launchers.elastic.ipc import staging
from launchers.persist.slot_copy import LiveSegment

CHILD = """\
import os, sys
from launchers.elastic.ipc import staging
seg = staging.Segment(staging.segment_path("regrow", 0), 0, 1, 0)
seg.ensure(4096)
reader = staging.SegmentReader(seg.path)
real = os.ftruncate
def ftruncate(fd, length):
    reader.status()  # mlaunch reading its mapping while the rank re-creates the segment
    real(fd, length)
os.ftruncate = ftruncate
seg.ensure(1 << 20)  # the rank's state grew
print("read through the re-creation:", reader.info.rank, reader.info.capacity, flush=True)
"""


def test_the_agents_mapping_survives_a_segment_re_created_for_a_larger_state(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**os.environ, "MLAUNCH_SHM_DIR": str(tmp_path)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"exit {done.returncode} (-7: SIGBUS)\n{done.stdout}{done.stderr}"
    assert "read through the re-creation: 0 4096" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlaunch.regrow.rank0"]  # nothing half-built left


def test_the_background_reader_follows_the_re_created_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LiveSegment`` (background persist, peer copy) keeps a descriptor: it must read the new file, not the old."""
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    seg = staging.Segment(staging.segment_path("follow", 3), 3, 4, 0)
    seg.ensure(4096)
    live = LiveSegment(seg.path)
    first = live.header()
    assert first is not None and first.capacity == 4096
    seg.ensure(1 << 20)
    grown = live.header()
    assert grown is not None and (grown.rank, grown.capacity) == (3, 1 << 20)
    live.close()
    seg.close()
    assert staging.unlink_run("follow") == 1
