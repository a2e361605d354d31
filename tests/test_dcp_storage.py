"""DCP users get mlaunch's checkpoints (issue 23, item 4): dcp.save/async_save/load through mlaunch's plug-ins.

Real FSDP2 ranks under mlaunch (tests/scripts/dcp_interop.py), gloo on CPU:

- ``dcp.save``, ``dcp.async_save`` (thread) and ``dcp.async_save`` (process) into
  ``MlaunchStorageWriter`` commit steps in mlaunch's layout — a ``COMMITTED`` marker, one
  JSON-headed shard per rank, no pickled ``.metadata`` — that ``dcp.load`` with
  ``MlaunchStorageReader`` and ``Checkpointer.load_latest(into=...)`` read back at half the
  ranks, equal to the state that was saved;
- a checkpoint mlaunch's own ``Checkpointer.save`` committed loads with ``dcp.load``;
- ``MlaunchStorageWriter(stage=True)`` stages into shared memory: after a kill -9, mlaunch's
  flash save commits the newest step every rank staged and the restarted ranks load it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, needs_torch, run_mlaunch

from launchers.elastic.format import layout, shardfile

pytestmark = [needs_torch, pytest.mark.slow]
SCRIPT = ROOT / "tests" / "scripts" / "dcp_interop.py"


def run(tmp: Path, args: list[str], *, nodes: int, restarts: int = 0) -> str:
    job = tmp / f"job-{args[0]}-{nodes}.yaml"
    job.write_text(
        f"name: dcp\nengine: pytorch\nentry: {SCRIPT}\nargs: {json.dumps(args)}\nnodes: {nodes}\n"
        f"procs_per_node: 2\nenv: {{GLOO_SOCKET_IFNAME: lo}}\nlog_dir: {tmp / 'logs'}\n"
        f"checkpoint: {{dir: {args[1]}}}\nrestart: {{max_restarts: {restarts}, backoff: 0s}}\n"
    )
    done = run_mlaunch(["--engine", "pytorch", str(job)])
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def loaded(output: str) -> list[str]:
    return re.findall(r"loaded step (\d+) at world size (\d+): (\w+)", output)


def test_dcp_saves_commit_in_mlaunchs_layout_and_load_resharded(tmp_path: Path) -> None:
    ckpt, ref = tmp_path / "ckpt", tmp_path / "ref"
    run(tmp_path, ["save-dcp", str(ckpt), str(ref)], nodes=2)
    items = layout.committed(ckpt)
    assert [item.step for item in items] == [4, 3, 2]  # dcp.save, async_save (thread), async_save (process)
    for item in items:
        assert item.manifest["source"] == "dcp" and item.world_size == 4
        assert not list(item.path.glob("*.metadata")), "no pickled DCP metadata"
        for rank in range(4):
            with open(item.shard(rank), "rb") as fh:
                assert fh.read(8) == shardfile.MAGIC  # mlaunch's JSON-headed shard, one per rank
    assert loaded(run(tmp_path, ["load", str(ckpt), str(ref), "dcp"], nodes=1)) == [
        ("4", "2", "equal"),
        ("2", "2", "equal"),
    ]
    assert loaded(run(tmp_path, ["load", str(ckpt), str(ref), "mlaunch"], nodes=1)) == [("4", "2", "equal")]


def test_a_checkpoint_mlaunch_committed_loads_with_dcp_load(tmp_path: Path) -> None:
    ckpt, ref = tmp_path / "ckpt", tmp_path / "ref"
    run(tmp_path, ["save-mlaunch", str(ckpt), str(ref)], nodes=2)
    assert layout.committed(ckpt)[0].manifest["source"] == "save"
    assert loaded(run(tmp_path, ["load", str(ckpt), str(ref), "dcp"], nodes=1)) == [("5", "2", "equal")]


def test_dcp_staging_writer_is_flash_saved_after_a_kill_9(tmp_path: Path) -> None:
    ckpt, ref = tmp_path / "ckpt", tmp_path / "ref"
    output = run(tmp_path, ["stage-dcp", str(ckpt), str(ref)], nodes=2, restarts=1)
    step = re.search(r"flash save after .*rank 3.*: committed step (\d+) from shared memory", output)
    assert step, output
    assert loaded(output) == [(step.group(1), "4", "equal")], output


def test_each_ranks_own_values_survive_checkpointer_save_where_dcps_planner_keeps_one(tmp_path: Path) -> None:
    """Why ``Checkpointer.save`` is not built on DCP's planner (issue 33 item 5): a rank's own values.

    A training script keeps per-rank values beside its sharded state (RNG state, data cursor).
    ``Checkpointer.save`` writes each rank's whole state and ``load_latest(into=)`` gives each rank
    its own back. DCP's global plan deduplicates every value that is not a DTensor to one rank, so
    through ``dcp.save`` every rank loads the same one: the second half asserts DCP's behaviour that
    the decision rests on, and fails the day it changes.
    """
    ckpt = tmp_path / "ckpt"
    output = run(tmp_path, ["per-rank", str(ckpt), str(tmp_path / "ref")], nodes=1)
    lines = re.findall(r"per-rank (\w+): rank (\d) saved (\(.*?\)) loaded (\(.*?\))", output)
    got = {(how, int(rank)): (saved, loaded) for how, rank, saved, loaded in lines}
    assert set(got) == {("save", 0), ("save", 1), ("dcp", 0), ("dcp", 1)}, output
    for rank in (0, 1):
        saved, loaded = got[("save", rank)]
        assert loaded == saved, f"Checkpointer lost rank {rank}'s own values: {output}"
    assert got[("dcp", 0)][1] == got[("dcp", 1)][1], f"DCP kept each rank's own values: {output}"
