"""Memory safety of checkpoints: no tensor is read through ``data_ptr()`` unless its storage holds the bytes.

A DTensor's ``data_ptr()`` is not its local shard's storage (0 for FSDP2 parameters) and its
``numel()`` is the global size: mlaunch used to build a raw view from them, which killed the
rank with SIGSEGV when it staged ``get_state_dict(model, optimizer)``. The cases run in a
subprocess with a real one-rank gloo group (tests/scripts/tensor_cases.py), so a crash fails
the test instead of killing pytest, and each case goes through ``stage`` (shared memory),
``save`` (commit) and ``load_latest(into=...)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, needs_torch

from launchers.platform.cluster import free_port

pytestmark = needs_torch
SCRIPT = ROOT / "tests" / "scripts" / "tensor_cases.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("tensor-cases")
    (tmp / "shm").mkdir()
    env = clean_env(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        MLAUNCH_RUN_ID="tensorcases",  # staging as under mlaunch, into a private shared-memory directory
        MLAUNCH_SHM_DIR=str(tmp / "shm"),
    )
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp / "ckpt")], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["case"]: row for row in rows}


def test_a_dtensor_is_staged_saved_and_loaded_back(results: dict[str, dict[str, str]]) -> None:
    row = results["dtensor"]
    assert (row["staged"], row["saved"], row["loaded"]) == ("ok", "ok", "equal")


@pytest.mark.parametrize("case", ["noncontiguous", "zero_size"])
def test_plain_tensors_of_any_layout_round_trip(results: dict[str, dict[str, str]], case: str) -> None:
    row = results[case]
    assert (row["staged"], row["saved"], row["loaded"], row["plain"]) == ("ok", "ok", "equal", "equal")


@pytest.mark.parametrize(
    ("case", "why"),
    [("wrapper", r"is a __main__\.Wrapper, a tensor subclass"), ("meta", "is a tensor on the meta device")],
)
def test_a_tensor_without_readable_bytes_is_refused_naming_its_key(
    results: dict[str, dict[str, str]], case: str, why: str
) -> None:
    row = results[case]
    for how in ("staged", "saved"):
        assert row[how].startswith("refused: "), row
        assert "state['layer']['w']" in row[how] and why.replace("\\", "") in row[how].replace("\\", ""), row
    assert "loaded" not in row  # nothing was committed


def test_a_sharded_checkpoint_read_without_a_target_says_how(tmp_path: Path) -> None:
    """``load_latest()`` cannot place DTensor shards without the running job's layout: a clear error."""
    from launchers.elastic import Checkpointer, CheckpointError
    from launchers.elastic.format import layout, shardfile

    step = tmp_path / (layout.step_name(1) + ".tmp")
    step.mkdir()
    header = {"format": 2, "meta": {}, "skeleton": {"w": {"$ref": None, "dtensor": {"shape": [4]}}}, "blobs": []}
    raw = json.dumps(header).encode()
    image = shardfile.PREFIX.pack(shardfile.MAGIC, len(raw), 0) + raw
    (step / layout.shard_name(0)).write_bytes(image.ljust(shardfile.align(len(image)), b"\0"))
    layout.commit(step, tmp_path / layout.step_name(1), 1, 1, {0: (step / layout.shard_name(0)).stat().st_size})
    with pytest.raises(CheckpointError, match=r"DTensor shards.*load_latest\(into=state\)"):
        Checkpointer(tmp_path).load_latest()
