"""No silent fresh start under mlaunch (issue 34 item 2): committed steps that none can load.

Real mlaunch, 2 simulated nodes × 1 rank of ``tests/scripts/plain_ddp.py`` (gloo, CPU), over a
checkpoint directory whose only committed step is unreadable (its shard overwritten with garbage
of the same size: the marker's size check passes, decoding fails — a bit flip on storage).
By default every rank raises and the job fails before its first step; with
``checkpoint.on_unreadable: start_over`` it trains from scratch, and mlaunch's output,
``events.jsonl`` and ``mlaunch status`` all say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, needs_torch, run_mlaunch

from launchers.elastic import Checkpointer
from launchers.elastic.format import layout

pytestmark = needs_torch


def prepare(tmp: Path, policy: str) -> Path:
    ckpt = tmp / "ckpt"
    saver = Checkpointer(ckpt)
    saver.save(4, {"step": 4})
    shard = ckpt / layout.step_name(4) / "rank_0.mlck"
    shard.write_bytes(b"\xff" * shard.stat().st_size)
    job = tmp / "job.yaml"
    job.write_text(
        f"name: start-over\nengine: pytorch\nentry: {ROOT / 'tests' / 'scripts' / 'plain_ddp.py'}\n"
        "args: ['--steps', '3', '--step-sleep', '0']\nnodes: 2\nprocs_per_node: 1\n"
        f"log_dir: {tmp / 'logs'}\ncheckpoint: {{dir: {ckpt}, on_unreadable: {policy}}}\n"
    )
    return job


def test_unreadable_commits_fail_the_job_on_every_rank_before_its_first_step(tmp_path: Path) -> None:
    result = run_mlaunch(["--engine", "pytorch", str(prepare(tmp_path, "fail"))], env=clean_env())
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "committed checkpoints exist" in out and "newest: step 4" in out, out
    assert "step 0 loss" not in out  # nothing trained


def test_start_over_trains_from_scratch_and_says_so_everywhere(tmp_path: Path) -> None:
    job = prepare(tmp_path, "start_over")
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=clean_env())
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "WARNING: starting over from scratch although step 4 is committed" in out, out
    assert "WARNING: attempt 0 trains from scratch although step 4 is committed" in out, out
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    over = [e for e in events if e["event"] == "started_over"]
    assert over and over[0]["committed_step"] == 4 and over[0]["ranks"] == [0, 1], events
    status = json.loads((tmp_path / "logs" / "status.json").read_text())
    assert status["started_over"]["committed_step"] == 4, status
    shown = run_mlaunch(["status", str(job)], env=clean_env(COLUMNS="300")).stdout
    assert "trained from scratch although step 4 is committed" in shown, shown


@pytest.mark.parametrize("value", ["maybe", "[1]"])
def test_a_bad_on_unreadable_value_is_a_user_error_naming_the_key(tmp_path: Path, value: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"entry: train.py\ncheckpoint: {{on_unreadable: {value}}}\n")
    result = run_mlaunch(["check", str(job)], env=clean_env())
    assert result.returncode == 2 and "on_unreadable" in result.stderr + result.stdout, result.stderr
