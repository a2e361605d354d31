"""Issue 25 item 2: the status view, events.jsonl and goodput count the commits mlaunch makes itself.

A rank killed with ``kill -9`` cannot save; mlaunch's flash save commits the newest step every rank
staged ("committed step N from shared memory"). The ranks never report that commit, so before
this the status view said "last committed step -" and every rank's committed column "-", also
after the restart that resumed from it. Real mlaunch, real gloo ranks (the PyTorch example under
the chaos wrapper, ``--save-every`` off so that the flash save is the only commit), a real SIGKILL.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, needs_torch, run_mlaunch

from launchers.observe.events_log import read_events

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import CHAOS  # noqa: E402


@needs_torch
@pytest.mark.slow
def test_kill_9_then_flash_save_shows_that_step_in_status_events_and_goodput(tmp_path: Path) -> None:
    state = tmp_path / "chaos"
    state.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: flashed\nengine: pytorch\nentry: {CHAOS}\nargs: ['--steps', '14']\nnodes: 2\nprocs_per_node: 2\n"
        f"env: {{GLOO_SOCKET_IFNAME: lo, CHAOS_PLAN: '3:7:kill9', CHAOS_STATE: {state}, CHAOS_STEP_SLEEP: '0.05'}}\n"
        f"log_dir: {tmp_path / 'logs'}\ncheckpoint: {{dir: {tmp_path / 'ckpt'}, grace_period: 10s}}\n"
        "restart: {max_restarts: 1, backoff: 0s}\n"
    )
    result = run_mlaunch([str(job)], env=clean_env(), timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    flashed = re.search(r"flash save after .* failed: committed step (\d+) from shared memory", result.stderr)
    assert flashed, result.stderr[-4000:]
    step = int(flashed.group(1))
    assert f"resumed from step {step}" in result.stdout, result.stdout[-2000:]

    # after the restart finished the job, `mlaunch status --json` still shows the flash save's step
    status = run_mlaunch(["status", "--json", str(job)])
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert view["phase"] == "finished" and view["last_committed_step"] == step, view
    ranks = [r for n in view["nodes"] for r in n["ranks"]]
    assert len(ranks) == 4 and all(r["committed_step"] == step for r in ranks), ranks
    shown = run_mlaunch(["status", str(job)], env=clean_env(COLUMNS="200"))
    assert f"last committed step {step}" in shown.stdout, shown.stdout

    events = read_events(tmp_path / "logs" / "events.jsonl")
    commits = [e for e in events if e["event"] == "checkpoint"]
    assert [(e["step"], e.get("source")) for e in commits] == [(step, "flash")], commits
    (end,) = [e for e in events if e["event"] == "end"]
    assert end["committed_step"] == step and end["commits"] == {"flash": 1}, end
    assert f"newest commit step {step} (flash save)" in result.stderr, result.stderr[-2000:]
