"""Agent-side flash save: shared-memory staging, persisting the newest consistent step, commit.

The staging segments are real shared-memory files (in a per-test directory through
``MLAUNCH_SHM_DIR``), written by real processes (tests/scripts/stage_writer.py) that the tests
SIGKILL at random moments, including in the middle of a copy. What is persisted is read back
with ``Checkpointer.load_latest``, the reader the training script uses.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env

from launchers.elastic import Checkpointer
from launchers.elastic.format import layout, shardfile
from launchers.elastic.ipc import staging
from launchers.elastic.storage import durable
from launchers.persist import flash_save

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import fill, tmpfs, wait_for  # noqa: E402

np = pytest.importorskip("numpy")
WRITER = ROOT / "tests" / "scripts" / "stage_writer.py"
RUN = "testrun"


def stage(rank: int, world: int, steps: list[int], ckpt: Path, attempt: int = 0, elements: int = 64) -> None:
    seg = staging.Segment(staging.segment_path(RUN, rank), rank, world, attempt)
    seg.set_target(str(ckpt), 3)
    for step in steps:
        state = {"step": step, "rank": rank, "w": np.full(elements, step, dtype=np.int64)}
        seg.stage(step, shardfile.encode(state, {"step": step, "rank": rank}))
    seg.close()


def persist(  # type: ignore[no-untyped-def]
    rank_nodes: dict[int, int],
    nnodes: int = 1,
    attempt: int = 0,
    deadline: float = 10.0,
    key: str = "k",
    events: Any = None,
):
    exchange = events.reduce if events is not None else None
    return flash_save.persist(
        RUN,
        attempt=attempt,
        rank_nodes=rank_nodes,
        nnodes=nnodes,
        key=key,
        deadline=time.monotonic() + deadline,
        exchange=exchange,
    )


@pytest.fixture
def plane() -> Iterator[list[Any]]:
    """Two nodes' real control plane on loopback (node 0 hosts the hub): how real nodes agree on a step."""
    pytest.importorskip("zmq")
    from launchers.control.agent import NetworkEvents
    from launchers.platform.cluster import free_port

    port = free_port()
    nodes = [
        NetworkEvents(node=n, nnodes=2, master_addr="127.0.0.1", port=port, secret=b"f" * 32, node_timeout=5.0)
        for n in (0, 1)
    ]
    try:
        assert all(n.joined(time.monotonic() + 30) for n in nodes)
        yield nodes
    finally:
        nodes[1].close(0)
        nodes[0].close(0)


def read_rank(ckpt: Path, rank: int, step: int) -> dict:  # type: ignore[type-arg]
    state, meta = shardfile.read_file(ckpt / layout.step_name(step) / layout.shard_name(rank))
    assert meta["rank"] == rank and meta["step"] == step
    return state  # type: ignore[no-any-return]


def test_the_newest_step_every_rank_staged_is_committed(shm: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    stage(0, 2, [3, 4, 5], ckpt)
    stage(1, 2, [3, 4], ckpt)  # rank 1 died before staging 5
    result = persist({0: 0, 1: 0})
    assert result.status == "committed", result.message
    assert result.step == 4 and result.path == ckpt / "step_00000004"
    manifest = layout.read_marker(ckpt / "step_00000004")
    assert manifest is not None and manifest["source"] == "flash" and manifest["world_size"] == 2
    for rank in (0, 1):
        state = read_rank(ckpt, rank, 4)
        assert state["rank"] == rank and (state["w"] == 4).all()
    # the same format the training script resumes from
    assert (Checkpointer(ckpt).committed()[0].step) == 4


def test_nothing_is_written_when_the_step_is_already_committed(shm: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    stage(0, 1, [7], ckpt)
    Checkpointer(ckpt).save(7, {"step": 7})
    result = persist({0: 0})
    assert result.status == "skipped" and sorted(p.name for p in ckpt.iterdir()) == ["step_00000007"]


def test_a_torn_slot_is_never_persisted(shm: Path, tmp_path: Path) -> None:
    """A writer killed mid-copy leaves an odd sequence number: that slot does not count."""
    ckpt = tmp_path / "ckpt"
    stage(0, 1, [1, 2], ckpt)
    import mmap
    import os
    import struct

    fd = os.open(staging.segment_path(RUN, 0), os.O_RDWR)
    mm = mmap.mmap(fd, 0)
    slots = staging.SegmentReader(staging.segment_path(RUN, 0)).slots()
    newest = max(slots, key=lambda s: s.step)
    struct.pack_into("<Q", mm, staging._SLOTS_AT + newest.index * staging._SLOT_STRIDE, newest.seq + 1)  # odd
    mm.close()
    os.close(fd)
    result = persist({0: 0})
    assert result.status == "committed" and result.step == 1


def test_no_common_step_and_other_attempts_are_not_mixed(shm: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    stage(0, 2, [8, 9], ckpt)
    stage(1, 2, [5, 6], ckpt)
    assert persist({0: 0, 1: 0}).status == "nothing"
    stage(1, 2, [8, 9], ckpt, attempt=1)  # a restarted rank's slots belong to another attempt
    result = persist({0: 0, 1: 0}, attempt=0)
    assert result.status == "nothing" and "staged nothing in this attempt" in result.message
    assert not ckpt.exists() or not any(ckpt.iterdir())


def test_a_deadline_that_passes_commits_nothing(shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = tmp_path / "ckpt"
    stage(0, 2, [1], ckpt)
    stage(1, 2, [1], ckpt)
    monkeypatch.setattr(durable, "before_fill", lambda: time.sleep(0.5))  # slow storage
    result = persist({0: 0, 1: 0}, deadline=0.2)
    assert result.status == "failed" and "deadline" in result.message
    assert not ckpt.exists() or not list(ckpt.iterdir())


def test_two_nodes_agree_through_the_control_plane(shm: Path, tmp_path: Path, plane: list[Any]) -> None:
    """Each node's mlaunch persists its own ranks; node 0 commits once both are written."""
    ckpt = tmp_path / "ckpt"
    stage(0, 4, [4, 5], ckpt)
    stage(1, 4, [4, 5], ckpt)
    stage(2, 4, [4, 5], ckpt)
    stage(3, 4, [3, 4], ckpt)  # node 1 is one step behind: they agree on 4
    results: dict[int, flash_save.FlashResult] = {}
    node1 = threading.Thread(target=lambda: results.__setitem__(1, persist({2: 1, 3: 1}, 2, events=plane[1])))
    node1.start()
    time.sleep(0.3)  # node 1 reports first
    results[0] = persist({0: 0, 1: 0}, 2, events=plane[0])
    node1.join()
    assert results[1].status == "written" and results[1].step == 4
    assert results[0].status == "committed" and results[0].step == 4, results[0].message
    manifest = layout.read_marker(ckpt / "step_00000004")
    assert manifest is not None and sorted(manifest["shards"]) == ["0", "1", "2", "3"]
    assert not list(ckpt.glob("step_*.tmp"))


def test_a_node_that_never_reports_means_no_commit(shm: Path, tmp_path: Path, plane: list[Any]) -> None:
    ckpt = tmp_path / "ckpt"
    stage(0, 2, [2], ckpt)
    result = persist({0: 0}, 2, deadline=0.5, events=plane[0])  # node 1 is there but never persists
    assert result.status == "failed" and not list(ckpt.glob("step_*")), result.message


def test_several_nodes_without_the_control_plane_commit_nothing(shm: Path, tmp_path: Path) -> None:
    """Real nodes always have the plane; a share of a multi-node job without it is refused, never guessed."""
    ckpt = tmp_path / "ckpt"
    stage(0, 2, [2], ckpt)
    result = persist({0: 0}, nnodes=2)
    assert result.status == "failed" and "control plane" in result.message
    assert not ckpt.exists() or not list(ckpt.glob("step_*"))


def test_disk_full_commits_nothing_and_keeps_the_previous_checkpoint(shm: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "1m") as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        Checkpointer(mount).save(1, {"w": np.ones(10)})
        stage(0, 1, [2], mount, elements=1 << 18)  # 2 MB: does not fit
        result = persist({0: 0})
        assert result.status == "failed" and "No space left" in result.message
        assert sorted(p.name for p in mount.iterdir()) == ["step_00000001"]
        fill(mount)
        assert Checkpointer(mount).load_latest() is not None


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_at_random_moments_never_persists_a_half_copied_buffer(shm: Path, tmp_path: Path, seed: int) -> None:
    """Real writers, real SIGKILL while they copy 8 MB per step: every persisted value equals its step."""
    rng = random.Random(seed)
    ckpt = tmp_path / "ckpt"
    for round_ in range(4):
        procs = []
        lines: list[list[str]] = [[], []]
        for rank in (0, 1):
            env = clean_env(
                MLAUNCH_RUN_ID=RUN,
                MLAUNCH_SHM_DIR=str(shm),
                RANK=str(rank),
                WORLD_SIZE="2",
                CKPT_DIR=str(ckpt),
                MLAUNCH_RESTART_COUNT=str(round_),
                START=str(round_ * 1000),
            )
            proc = subprocess.Popen([sys.executable, str(WRITER)], env=env, text=True, stdout=subprocess.PIPE)
            procs.append(proc)

            def pump(p: subprocess.Popen[str] = proc, out: list[str] = lines[rank]) -> None:
                assert p.stdout is not None
                for line in p.stdout:
                    out.append(line)

            threading.Thread(target=pump, daemon=True).start()
        assert wait_for(lambda lines=lines: all(len(out) >= 3 for out in lines), timeout=60)
        time.sleep(rng.uniform(0.0, 0.3))
        for proc in procs:
            proc.kill()
            proc.wait()
        result = persist({0: 0, 1: 0}, attempt=round_)
        assert result.status in ("committed", "nothing", "skipped"), result.message
        if result.status == "committed":
            assert result.step is not None
            for rank in (0, 1):
                state = read_rank(ckpt, rank, result.step)
                assert state["step"] == result.step and state["tail"] == [result.step, str(result.step)]
                assert (state["w"] == result.step).all(), f"torn copy persisted in round {round_}"
        staging.unlink_run(RUN)


def test_a_live_writer_racing_the_copy_is_detected(shm: Path, tmp_path: Path) -> None:
    """A writer that keeps staging while the agent copies: either a consistent commit or none."""
    ckpt = tmp_path / "ckpt"
    env = clean_env(
        MLAUNCH_RUN_ID=RUN,
        MLAUNCH_SHM_DIR=str(shm),
        RANK="0",
        WORLD_SIZE="1",
        CKPT_DIR=str(ckpt),
        ELEMENTS=str(1 << 21),
    )
    proc = subprocess.Popen([sys.executable, str(WRITER)], env=env, text=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        for _ in range(3):
            proc.stdout.readline()
        outcomes = set()
        for _ in range(5):
            result = persist({0: 0})
            outcomes.add(result.status)
            if result.status == "committed":
                assert result.step is not None
                assert (read_rank(ckpt, 0, result.step)["w"] == result.step).all()
            else:
                assert result.status in ("failed", "skipped"), result.message
    finally:
        proc.kill()
        proc.wait()
    assert outcomes & {"committed", "failed"}


def test_unlink_run_frees_every_segment(shm: Path, tmp_path: Path) -> None:
    stage(0, 2, [1], tmp_path)
    stage(1, 2, [1], tmp_path)
    assert len(staging.run_segments(RUN)) == 2
    assert staging.unlink_run(RUN) == 2 and list(shm.iterdir()) == []
