"""Atomic checkpoints: the shard format, the commit protocol, resume, keep-last-k, disk full.

Single-process tests call the library directly; the multi-rank ones start real gloo processes
(tests/scripts/elastic_ranks.py). Disk full is a real, small tmpfs (skipped when mounting is
refused, i.e. not root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, needs_torch

from launchers.elastic import Checkpointer, CheckpointError
from launchers.elastic.format import layout, shardfile
from launchers.platform.cluster import free_port

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import tmpfs  # noqa: E402

RANKS = ROOT / "tests" / "scripts" / "elastic_ranks.py"
np = pytest.importorskip("numpy")


# ----------------------------------------------------------------------------------------
# The shard format
# ----------------------------------------------------------------------------------------


def test_numpy_and_plain_state_round_trips(tmp_path: Path) -> None:
    state = OrderedDict(
        a=np.arange(12, dtype=np.float32).reshape(3, 4),
        b=[np.zeros(0, dtype=np.int64), (1, "two", 3.0)],
        c={"nested": {"x": np.array(7, dtype=np.int16)}, "none": None},
        strided=np.arange(20, dtype=np.float64)[::3],
        objects=np.array(["x", 1], dtype=object),  # pickled, so only with trusted=True
    )
    shardfile.write_file(tmp_path / "s", shardfile.encode(state, {"step": 5}, trusted=True))
    back, meta = shardfile.read_file(tmp_path / "s", trusted=True)
    assert meta == {"step": 5}
    assert type(back) is OrderedDict and list(back) == list(state)
    assert back["a"].dtype == np.float32 and (back["a"] == state["a"]).all()
    assert back["b"][1] == (1, "two", 3.0) and back["b"][0].shape == (0,)
    assert back["c"]["nested"]["x"] == 7 and back["c"]["none"] is None
    assert (back["strided"] == state["strided"]).all()
    assert list(back["objects"]) == ["x", 1]
    assert back["a"].flags.writeable  # its own memory, not a view of the file


@needs_torch
def test_torch_tensors_round_trip_bit_exactly(tmp_path: Path) -> None:
    import torch

    from launchers.elastic import pytorch as ept

    torch.manual_seed(0)
    state = {
        "f32": torch.randn(5, 7),
        "bf16": torch.randn(33).to(torch.bfloat16),
        "i64": torch.arange(10),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "transposed": torch.randn(4, 6).t(),
        "complex": torch.randn(3, dtype=torch.complex64),
        "rng": ept.rng_state(),
        "param": torch.nn.Parameter(torch.ones(2)),
    }
    shardfile.write_file(tmp_path / "s", shardfile.encode(state))
    back, _ = shardfile.read_file(tmp_path / "s")
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
            assert torch.equal(back[key], value.detach()), key
    assert torch.equal(back["rng"]["torch"], state["rng"]["torch"])
    assert back["rng"]["python"] == state["rng"]["python"]


def test_truncated_or_foreign_files_are_rejected(tmp_path: Path) -> None:
    shardfile.write_file(tmp_path / "s", shardfile.encode({"a": np.ones(1000)}))
    data = (tmp_path / "s").read_bytes()
    (tmp_path / "t").write_bytes(data[:-100])
    with pytest.raises(shardfile.ShardFormatError):
        shardfile.read_file(tmp_path / "t")
    (tmp_path / "u").write_bytes(b"not a shard at all, really")
    with pytest.raises(shardfile.ShardFormatError):
        shardfile.read_file(tmp_path / "u")


# ----------------------------------------------------------------------------------------
# One process: commit, resume, keep-last-k
# ----------------------------------------------------------------------------------------


def test_fresh_start_without_a_directory(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "does" / "not" / "exist")
    assert ckpt.load_latest() is None and ckpt.loaded_step is None


def test_save_commits_with_a_marker_and_load_returns_the_newest(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=10)
    for step in (2, 5, 9):
        ckpt.save(step, {"step": step, "w": np.full(4, step)})
    assert [c.step for c in ckpt.committed()] == [9, 5, 2]
    manifest = json.loads((tmp_path / "step_00000009" / layout.MARKER).read_text())
    assert manifest["step"] == 9 and manifest["world_size"] == 1 and manifest["source"] == "save"
    assert manifest["shards"]["0"]["bytes"] == (tmp_path / "step_00000009" / "rank_0.mlck").stat().st_size
    state = Checkpointer(tmp_path).load_latest()
    assert state is not None and state["step"] == 9 and (state["w"] == 9).all()
    assert not list(tmp_path.glob("*.tmp"))


def test_uncommitted_directories_are_ignored_and_cleaned(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save(3, {"step": 3})
    # a save that died before its marker: complete-looking shards, higher step numbers
    for name in ("step_00000007.tmp", "step_00000008", "step_00000009.flash-a0p1.tmp"):
        (tmp_path / name).mkdir()
        shardfile.write_file(tmp_path / name / "rank_0.mlck", shardfile.encode({"step": 99}))
    fresh = Checkpointer(tmp_path)
    state = fresh.load_latest()
    assert state == {"step": 3} and fresh.loaded_step == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003"]  # rank 0 removed the partials


def test_a_marker_whose_shard_is_truncated_does_not_count(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=5)
    ckpt.save(1, {"w": np.ones(100)})
    ckpt.save(2, {"w": np.ones(100) * 2})
    shard = tmp_path / "step_00000002" / "rank_0.mlck"
    shard.write_bytes(shard.read_bytes()[:50])
    state = Checkpointer(tmp_path).load_latest()
    assert state is not None and (state["w"] == 1).all()


def test_committed_but_not_yet_renamed_counts(tmp_path: Path) -> None:
    """A crash between writing the marker and renaming step_N.tmp loses nothing."""
    tmp = tmp_path / "step_00000004.tmp"
    tmp.mkdir()
    size = shardfile.write_file(tmp / "rank_0.mlck", shardfile.encode({"step": 4}))
    layout.write_json_atomic(
        tmp / layout.MARKER,
        {"step": 4, "world_size": 1, "shards": {"0": {"file": "rank_0.mlck", "bytes": size}}},
    )
    assert [c.step for c in layout.committed(tmp_path)] == [4]
    assert Checkpointer(tmp_path).load_latest() == {"step": 4}


def test_commit_refuses_a_missing_rank(tmp_path: Path) -> None:
    tmp = tmp_path / "step_00000001.tmp"
    tmp.mkdir()
    size = shardfile.write_file(tmp / "rank_0.mlck", shardfile.encode({}))
    with pytest.raises(OSError, match=r"no shard from rank\(s\) \[1\]"):
        layout.commit(tmp, tmp_path / "step_00000001", 1, 2, {0: size})
    assert not (tmp / layout.MARKER).exists()


def test_keep_last_k(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in range(6):
        ckpt.save(step, {"step": step})
    assert [c.step for c in ckpt.committed()] == [5, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000005"]


def test_saving_a_step_again_replaces_a_stale_partial_directory(tmp_path: Path) -> None:
    stale = tmp_path / "step_00000006.tmp"
    stale.mkdir(parents=True)
    (stale / "rank_0.mlck").write_bytes(b"half a shard")
    (stale / "junk").write_bytes(b"x")
    Checkpointer(tmp_path).save(6, {"step": 6})
    assert sorted(p.name for p in (tmp_path / "step_00000006").iterdir()) == [layout.MARKER, "rank_0.mlck"]


def test_replicas_stand_in_for_a_missing_shard(tmp_path: Path) -> None:
    """A dying checkpoint written by one member per replica group still resumes the others."""
    tmp = tmp_path / "step_00000002.tmp"
    tmp.mkdir()
    size = shardfile.write_file(tmp / "rank_0.mlck", shardfile.encode({"from": 0}))
    layout.commit(tmp, tmp_path / "step_00000002", 2, 1, {0: size})
    os.rename(tmp_path / "step_00000002" / "rank_0.mlck", tmp_path / "step_00000002" / "rank_4.mlck")
    manifest = json.loads((tmp_path / "step_00000002" / layout.MARKER).read_text())
    manifest["shards"] = {"4": {"file": "rank_4.mlck", "bytes": size}}
    layout.write_json_atomic(tmp_path / "step_00000002" / layout.MARKER, manifest)
    with pytest.raises(CheckpointError, match="no shard for rank 0"):  # never a silent fresh start
        Checkpointer(tmp_path).load_latest()
    assert Checkpointer(tmp_path, replicas=[0, 4]).load_latest() == {"from": 0}


def test_disk_full_fails_the_save_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "256k") as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        ckpt = Checkpointer(mount, keep=1)
        ckpt.save(1, {"w": np.ones(1000)})
        with pytest.raises(CheckpointError, match="No space left"):
            ckpt.save(2, {"w": np.ones(100_000)})  # 800 kB into 256 kB
        assert [c.step for c in ckpt.committed()] == [1]
        assert sorted(p.name for p in mount.iterdir()) == ["step_00000001"]
        state = Checkpointer(mount).load_latest()
        assert state is not None and (state["w"] == 1).all()


# ----------------------------------------------------------------------------------------
# Several ranks (real processes, gloo)
# ----------------------------------------------------------------------------------------


def run_ranks(mode: str, ckpt: Path, world: int, **env: str) -> list[subprocess.CompletedProcess[str]]:
    port = str(free_port())
    procs = []
    for rank in range(world):
        e = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world), **env)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(RANKS), mode, str(ckpt)],
                env=e,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


@needs_torch
def test_every_rank_writes_and_rank_0_commits(tmp_path: Path) -> None:
    results = run_ranks("save", tmp_path, 3, STEP="7")
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    assert all("saved" in r.stdout for r in results)
    manifest = json.loads((tmp_path / "step_00000007" / layout.MARKER).read_text())
    assert sorted(manifest["shards"]) == ["0", "1", "2"] and manifest["world_size"] == 3
    loaded = run_ranks("load", tmp_path, 3, STEP="7")
    lines = [r.stdout.strip() for r in loaded]
    assert all(line.startswith("loaded 7 ") for line in lines) and len(set(lines)) == 3  # each rank its own shard


@needs_torch
def test_a_shard_one_rank_cannot_read_sends_every_rank_back_to_the_older_step(tmp_path: Path) -> None:
    """Step 2's shard of rank 1 is damaged (its size intact, its header not): both ranks load step 1, and say why.

    Each rank reads its newest step before the ranks agree (one collective when all is well): here rank 0
    read step 2 and must not keep it.
    """
    assert [r.returncode for r in run_ranks("save", tmp_path, 2, STEP="1,2")] == [0, 0]
    expected = [r.stdout.strip() for r in run_ranks("load", tmp_path, 2)]
    assert all(line.startswith("loaded 2 ") for line in expected), expected
    shard = tmp_path / "step_00000002" / "rank_1.mlck"
    with open(shard, "r+b") as fh:
        fh.write(b"\0" * 16)
    results = run_ranks("load", tmp_path, 2)
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    lines = [r.stdout.strip().splitlines()[-1] for r in results]
    assert all(line.startswith("loaded 1 ") for line in lines), lines
    assert lines[0] != lines[1]  # each rank its own shard of step 1
    assert "cannot use step 2" in results[1].stdout + results[1].stderr


@needs_torch
def test_ranks_that_see_different_newest_steps_load_the_newest_every_rank_sees(tmp_path: Path) -> None:
    """Rank 1's node sees steps 1 and 2, rank 0's only step 1 (a copy): every rank loads step 1."""
    import shutil

    assert [r.returncode for r in run_ranks("save", tmp_path / "full", 2, STEP="1,2")] == [0, 0]
    (tmp_path / "behind").mkdir()
    shutil.copytree(tmp_path / "full" / "step_00000001", tmp_path / "behind" / "step_00000001")
    results = run_ranks("load", tmp_path / "full", 2, CKPT_DIR_0=str(tmp_path / "behind"))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    lines = [r.stdout.strip() for r in results]
    assert all(line.startswith("loaded 1 ") for line in lines) and lines[0] != lines[1], lines


@needs_torch
def test_one_rank_out_of_space_fails_the_save_on_every_rank(tmp_path: Path) -> None:
    """Rank 1's shard does not fit (a real tmpfs): nobody commits, nobody hangs, the old step stays."""
    with tmpfs(tmp_path / "small", "2m") as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        first = run_ranks("save", mount, 2, STEP="1")
        assert [r.returncode for r in first] == [0, 0]
        results = run_ranks("save", mount, 2, STEP="2", BYTES_1=str(4 << 20))
        assert [r.returncode for r in results] == [3, 3], [r.stdout + r.stderr for r in results]
        assert all("not committed" in r.stdout for r in results)
        assert [c.step for c in layout.committed(mount)] == [1]
        assert not (mount / "step_00000002").exists() and not (mount / "step_00000002.tmp").exists()


@needs_torch
def test_without_a_process_group_rank_0_commits_after_every_done_file(tmp_path: Path) -> None:
    results = run_ranks("save", tmp_path, 2, STEP="3", NO_DIST="1")
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert [c.step for c in layout.committed(tmp_path)] == [3]
    assert sorted(p.name for p in (tmp_path / "step_00000003").iterdir()) == [
        layout.MARKER,
        "rank_0.mlck",
        "rank_1.mlck",
    ]


@needs_torch
def test_per_rank_state_at_another_world_size_fails_loudly_on_every_rank(tmp_path: Path) -> None:
    """Values that differ between the saving ranks cannot be any new rank's state: every rank raises, naming them."""
    assert [r.returncode for r in run_ranks("save", tmp_path, 2, STEP="1")] == [0, 0]
    results = run_ranks("load", tmp_path, 3)
    assert [r.returncode for r in results] == [4, 4, 4], [r.stderr for r in results]
    for result in results:
        line = result.stdout.strip()
        assert line.startswith("load failed: cannot load step 1: it was written by 2 ranks and this job has 3")
        assert "'rank' (rank)" in line and "'w' (w)" in line and "load_latest(into=state)" in line
        assert "'step'" not in line  # the same on every rank: not named


@needs_torch
def test_replicated_state_loads_at_any_world_size(tmp_path: Path) -> None:
    """DDP-style state (every rank saved the same values) resumes a shrunk or grown job from the newest step.

    Saved by 2 ranks, loaded by 1 (shrunk to one), 3 (not a multiple) and 5 (grown past twice).
    """
    assert [r.returncode for r in run_ranks("save", tmp_path, 2, STEP="1", REPLICATED="1")] == [0, 0]
    assert [r.returncode for r in run_ranks("save", tmp_path, 2, STEP="6", REPLICATED="1")] == [0, 0]
    same = run_ranks("load", tmp_path, 2, REPLICATED="1")
    expected = same[0].stdout.strip()
    assert expected.startswith("loaded 6 ") and same[1].stdout.strip() == expected
    for world in (1, 3, 5):
        results = run_ranks("load", tmp_path, world, REPLICATED="1")
        assert [r.stdout.strip() for r in results] == [expected] * world, (world, [r.stderr for r in results])
        assert "its state is replicated" in results[0].stderr + results[0].stdout
