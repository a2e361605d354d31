"""The memory an in-place recovery keeps (issue 44): the recovering ranks read their step from it, not from disk.

Real shared-memory segments (a per-test ``MLAUNCH_SHM_DIR``) staged through ``staging.Segment``,
committed by the agent's real flash save, kept by ``kept_segments.keep_for_next_attempt`` (what
mlaunch does when ranks survive a peer's failure), then read back by ``Checkpointer.load_latest``:
the reader the training script calls. The end-to-end case (4 ranks, a kill -9) is in
``tests/test_in_place.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launchers.elastic import Checkpointer
from launchers.elastic.format import shardfile
from launchers.elastic.ipc import kept_segments, staging
from launchers.persist import flash_save

np = pytest.importorskip("numpy")

RUN = "keptrun"


@pytest.fixture
def committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Steps 4 and 5 staged by rank 0 of 1, step 5 committed by the flash save, the segment kept: the checkpoint dir."""
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(shm))
    monkeypatch.setenv("MLAUNCH_RUN_ID", RUN)
    ckpt = tmp_path / "ckpt"
    seg = staging.Segment(staging.segment_path(RUN, 0), 0, 1, 0)
    seg.set_target(str(ckpt), 3)
    for step in (4, 5):
        state = {"step": step, "w": np.full(64, step, dtype=np.int64)}
        seg.stage(step, shardfile.encode(state, {"step": step, "lineage": "mine"}))
    seg.close()
    result = flash_save.persist(RUN, attempt=0, rank_nodes={0: 0}, nnodes=1, key="k", deadline=time.monotonic() + 10)
    assert result.status == "committed" and result.step == 5, result
    assert kept_segments.keep_for_next_attempt(RUN) == 1
    assert not staging.run_segments(RUN)  # the next attempt stages afresh
    return ckpt


def shard_of_step_5(ckpt: Path) -> Path:
    (shard,) = (ckpt / "step_00000005").glob("rank_0.*")
    return shard


def test_the_step_comes_from_memory_when_the_kept_image_is_the_committed_one(
    committed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed file's tensor bytes are overwritten (same size, same header): the state loaded is the staged
    one, so it came from memory, and the rank says so."""
    shard = shard_of_step_5(committed)
    data = bytearray(shard.read_bytes())
    data[-64:] = bytes(64)
    shard.write_bytes(bytes(data))
    state = Checkpointer(str(committed)).load_latest()
    assert state["step"] == 5 and (state["w"] == 5).all(), state
    assert "step 5 read from the memory the in-place recovery kept" in capsys.readouterr().err


def test_a_kept_image_that_is_not_the_committed_shard_is_not_used(committed: Path) -> None:
    """Another lineage committed step 5 (same step and size, another header): the file is read, as without it."""
    shard = shard_of_step_5(committed)
    other = shardfile.encode({"step": 5, "w": np.full(64, 7, dtype=np.int64)}, {"step": 5, "lineage": "ours"})
    shard.unlink()
    shardfile.write_file(shard, other)
    state = Checkpointer(str(committed)).load_latest()
    assert (state["w"] == 7).all(), state


def test_the_kept_segments_go_with_the_run(committed: Path) -> None:
    assert staging.kept_segments(RUN)
    assert staging.unlink_kept(RUN) == 1 and not staging.kept_segments(RUN)
