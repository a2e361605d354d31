"""Which committed steps a resume may use: no silent fresh start, and the newest line of training wins (issue 34).

One process (no process group): the commit protocol, the markers' lineage and the resume rules
are the same as for many ranks. A step is made *committed but unreadable* by overwriting its
shard with garbage of the same size (the marker's size check passes, decoding fails) — what a
bit flip on storage or a foreign file does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from launchers.elastic import Checkpointer, CheckpointError
from launchers.elastic.format import layout


def _state(step: int, value: float) -> dict[str, object]:
    return {"step": step, "w": np.full(8, value)}


def _spoil(root: Path, step: int) -> None:
    shard = root / layout.step_name(step) / "rank_0.mlck"
    shard.write_bytes(b"\xff" * shard.stat().st_size)


def test_committed_steps_that_none_can_load_fail_loudly_with_the_reason_for_each(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    for step in (4, 9):
        ckpt.save(step, _state(step, 1.0))
    _spoil(tmp_path, 4)
    _spoil(tmp_path, 9)
    with pytest.raises(CheckpointError) as raised:
        Checkpointer(tmp_path).load_latest()
    text = str(raised.value)
    assert "newest: step 9" in text and "step 9: " in text and "step 4: " in text
    assert "checkpoint.on_unreadable: start_over" in text


def test_start_over_is_loud_and_its_saves_supersede_the_old_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = Checkpointer(tmp_path)
    for step in (4, 9):
        old.save(step, _state(step, 1.0))
    _spoil(tmp_path, 9)
    _spoil(tmp_path, 4)
    fresh = Checkpointer(tmp_path, on_unreadable="start_over")
    assert fresh.load_latest() is None
    assert "WARNING: starting over from scratch although step 9 is committed" in capsys.readouterr().err
    fresh.save(2, _state(2, 7.0))  # a fresh line: the old steps above -1 are another branch now
    assert [c.step for c in layout.committed(tmp_path)] == [2]
    state = Checkpointer(tmp_path).load_latest()
    assert state is not None and state["step"] == 2 and float(state["w"][0]) == 7.0


def test_a_save_over_another_lineage_replaces_it_and_the_newest_lineage_is_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = Checkpointer(tmp_path, keep=5)
    for step in (4, 9, 14):
        first.save(step, _state(step, 1.0))
    _spoil(tmp_path, 14)
    _spoil(tmp_path, 9)
    second = Checkpointer(tmp_path, keep=5)
    state = second.load_latest()
    assert state is not None and state["step"] == 4  # 14 and 9 cannot be read: the older step, said
    assert second.loaded is not None and second.loaded_step == 4
    capsys.readouterr()
    second.save(9, _state(9, 2.0))  # not "already committed": that step 9 is another line's
    said = capsys.readouterr().err
    assert "step 9 was committed by another line of training (one that started from scratch)" in said
    assert "this job resumed from step 4" in said
    marker = json.loads((tmp_path / layout.step_name(9) / layout.MARKER).read_text())
    assert marker["lineage"] == second.loaded.id and marker["resumed_step"] == 4
    # the old line's step 14 is newer, but it belongs to the abandoned branch: never loaded again
    assert [c.step for c in layout.committed(tmp_path)] == [9, 4]
    third = Checkpointer(tmp_path, keep=5)
    state = third.load_latest()
    assert state is not None and state["step"] == 9 and float(state["w"][0]) == 2.0
    third.save(19, _state(19, 3.0))  # the next commit's rotation removes the superseded step 14
    assert not (tmp_path / layout.step_name(14)).exists()


def test_the_same_line_saving_a_step_again_is_not_saved_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save(3, _state(3, 1.0))
    before = json.loads((tmp_path / layout.step_name(3) / layout.MARKER).read_text())["id"]
    ckpt.save(3, _state(3, 5.0))
    assert "step 3 is already committed; not saving it again" in capsys.readouterr().err
    assert json.loads((tmp_path / layout.step_name(3) / layout.MARKER).read_text())["id"] == before


def test_between_a_replacement_marker_and_the_removal_the_newer_commit_wins(tmp_path: Path) -> None:
    """A crash after the new marker but before the old directory went: both are committed, the newer is read."""
    old = Checkpointer(tmp_path)
    old.save(5, _state(5, 1.0))
    tmp = tmp_path / (layout.step_name(5) + ".tmp")
    tmp.mkdir()
    from launchers.elastic.format import shardfile

    size = shardfile.write_file(tmp / "rank_0.mlck", shardfile.encode(_state(5, 9.0)))
    manifest = {"lineage": "another", "resumed_step": 2}
    layout.write_json_atomic(
        tmp / layout.MARKER,
        {"step": 5, "world_size": 1, "time": 1e12, **manifest, "shards": {"0": {"file": "rank_0.mlck", "bytes": size}}},
    )
    (found,) = layout.committed(tmp_path)
    assert found.path == tmp and found.lineage == "another"
    state = Checkpointer(tmp_path).load_latest()
    assert state is not None and float(state["w"][0]) == 9.0
