"""The agent's one commit tail (``launchers.persist.agent_commit``), on real directories.

Flash save, background persist and the survivors' save all end here; what they rely on: a
commit is read back as committed, pruning keeps the newest ``keep``, a step that cannot be
committed raises without pruning anything, and a node that is not node 0 removes only its own
shards from a directory node 0 may still be committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launchers.elastic.format import layout
from launchers.persist import agent_commit


def _written(root: Path, step: int, shards: dict[int, bytes], tag: str = "flash-k") -> Path:
    tmp = root / f"{layout.step_name(step)}.{tag}.tmp"
    tmp.mkdir(parents=True)
    for index, data in shards.items():
        (tmp / layout.shard_name(index)).write_bytes(data)
    return tmp


def _sizes(shards: dict[int, bytes]) -> dict[int, int]:
    return {index: len(data) for index, data in shards.items()}


def test_commit_step_commits_and_keeps_the_newest(tmp_path: Path) -> None:
    shards = {0: b"a" * 10, 1: b"b" * 20}
    for step in (10, 20, 30):
        tmp = _written(tmp_path, step, shards)
        final = agent_commit.commit_step(tmp, tmp_path, step, 2, _sizes(shards), keep=2, source="flash")
        assert final == tmp_path / layout.step_name(step)
        assert not tmp.exists()
    assert [c.step for c in layout.committed(tmp_path)] == [30, 20]
    assert layout.read_marker(tmp_path / layout.step_name(30))["source"] == "flash"  # type: ignore[index]


def test_a_step_that_cannot_be_committed_raises_and_prunes_nothing(tmp_path: Path) -> None:
    shards = {0: b"a" * 10, 1: b"b" * 20}
    for step in (10, 20):
        agent_commit.commit_step(_written(tmp_path, step, shards), tmp_path, step, 2, _sizes(shards), keep=1)
    # only step 20 is kept; step 30 misses rank 1's shard
    tmp = _written(tmp_path, 30, {0: shards[0]})
    with pytest.raises(OSError, match="no shard from rank"):
        agent_commit.commit_step(tmp, tmp_path, 30, 2, {0: 10}, keep=1)
    assert [c.step for c in layout.committed(tmp_path)] == [20]


def test_discard_on_node_0_removes_the_directory_elsewhere_only_its_shards(tmp_path: Path) -> None:
    shards = {0: b"a", 1: b"b", 2: b"c", 3: b"d"}
    tmp = _written(tmp_path, 40, shards, tag="bg-k")
    agent_commit.discard(tmp, coordinator=False, shards=[2, 3])  # node 1 holds ranks 2 and 3
    assert sorted(p.name for p in tmp.iterdir()) == [layout.shard_name(0), layout.shard_name(1)]
    agent_commit.discard(tmp, coordinator=True, shards=[0, 1])
    assert not tmp.exists()
    agent_commit.discard(tmp, coordinator=False, shards=[2])  # already gone: nothing to say
