"""Issue 16 items 2-4: live straggler detection, ``mlaunch status``, events.jsonl and the goodput report.

The rules (straggler bound, goodput arithmetic) are tested on their own; the rest runs real
``mlaunch`` with real gloo ranks in a local simulation (the netns-hosts versions are in
``test_observe_hosts.py``).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch

from launchers.elastic.ipc import progress
from launchers.observe.events_log import read_events
from launchers.observe.goodput import Goodput, describe
from launchers.observe.straggler import RankSample, StragglerDetector

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import CHAOS  # noqa: E402

STRAGGLE = ROOT / "tests" / "scripts" / "straggle.py"


# -- the rules ---------------------------------------------------------------------------------
def _samples(step: int, times: dict[int, float]) -> list[RankSample]:
    return [RankSample(rank, rank // 2, f"h{rank // 2}", step, t) for rank, t in times.items()]


def test_a_rank_slow_for_n_steps_is_reported_once_then_recovered() -> None:
    detector = StragglerDetector(factor=1.5, steps=5)
    fast = {0: 0.03, 1: 0.03, 2: 0.031, 3: 0.03}
    slow = {**fast, 3: 0.25}
    assert detector.observe(_samples(0, fast)) == []
    assert detector.observe(_samples(2, slow)) == []  # 2 steps beyond the bound: not yet
    changes = detector.observe(_samples(6, slow))  # 6 steps beyond
    assert [(c.rank, c.slow) for c in changes] == [(3, True)]
    assert "rank 3 (node 1, host h1)" in changes[0].describe() and "8.2×" in changes[0].describe()
    assert detector.observe(_samples(20, slow)) == []  # reported once, not every sample
    assert detector.observe(_samples(22, fast)) == []  # 2 steps back under: not yet
    changes = detector.observe(_samples(30, fast))
    assert [(c.rank, c.slow) for c in changes] == [(3, False)]
    assert detector.slow == set()


def test_no_straggler_without_a_peer_to_compare_or_without_progress() -> None:
    detector = StragglerDetector(factor=1.5, steps=1)
    assert detector.observe(_samples(5, {0: 9.0})) == []
    assert detector.observe([RankSample(0, 0, "", 5, 0.1), RankSample(1, 0, "", -1, None)]) == []
    # a rank that did not advance is not judged, however slow its last figure
    detector.observe(_samples(5, {0: 0.1, 1: 0.1, 2: 0.1}))
    assert detector.observe(_samples(5, {0: 0.1, 1: 0.1, 2: 5.0})) == []


def test_goodput_counts_the_steps_a_restart_redid() -> None:
    clock = Goodput(started=100.0)
    first = clock.begin(0, 101.0)
    first.note(first_step=0, first_wall=105.0, step=12, last_wall=117.0, saving=0.5)
    first.ended = 119.0
    second = clock.begin(1, 121.0)  # resumed from the checkpoint of step 7: steps 8..12 are redone
    second.note(first_step=8, first_wall=124.0, step=29, last_wall=145.0, saving=0.5)
    second.ended = 146.0
    figures = clock.figures(ended=147.0)
    assert figures["restarts"] == 1
    assert figures["recomputed_steps"] == 5
    assert figures["recomputed_s"] == pytest.approx(5.0)  # 21 steps in 21 s
    assert figures["startup_s"] == pytest.approx(1 + 4 + 3)
    assert figures["restart_downtime_s"] == pytest.approx(2.0)
    assert figures["productive_s"] == pytest.approx(12 + 21 - 5 - 1)
    parts = ("productive_s", "recomputed_s", "checkpoint_stall_s", "startup_s", "restart_downtime_s", "other_s")
    assert sum(figures[p] for p in parts) == pytest.approx(figures["wall_s"])
    assert figures["goodput"] == pytest.approx(27 / 47, abs=1e-3)
    assert "recomputed 5 steps" in describe(figures)


def test_a_restart_that_skipped_committed_work_is_a_warning_naming_the_cause() -> None:
    """The issue's case: 4 ranks trained from step 0 although step 24 was committed, and goodput said nothing."""
    clock = Goodput(started=0.0)
    first = clock.begin(0, 1.0)
    for step in (4, 9, 14, 19, 24):
        clock.committed(step, "ranks")
    first.note(first_step=0, first_wall=2.0, step=26, last_wall=28.0, saving=0.0)
    first.ended = 29.0
    second = clock.begin(1, 30.0)
    second.note(first_step=0, first_wall=31.0, step=30, last_wall=61.0, saving=0.0)
    second.ended = 62.0
    warnings = clock.figures(ended=63.0)["recompute_warnings"]
    assert warnings == [
        "attempt 1 began from scratch although step 24 was committed: it did not resume from the newest commit, "
        "and redid 27 steps"
    ]


def test_recomputing_more_than_one_commit_interval_is_a_warning_and_less_is_not() -> None:
    def run(resumed_from: int) -> list[str]:
        clock = Goodput(started=0.0)
        first = clock.begin(0, 1.0)
        for step in (4, 9, 14):
            clock.committed(step, "background")
        first.note(first_step=0, first_wall=2.0, step=17, last_wall=19.0, saving=0.0)
        first.ended = 20.0
        second = clock.begin(1, 21.0)
        second.committed_before = resumed_from  # as if that were the newest commit when it began
        second.note(first_step=resumed_from + 1, first_wall=22.0, step=30, last_wall=40.0, saving=0.0)
        figures: list[str] = clock.figures(ended=41.0)["recompute_warnings"]
        return figures

    assert run(14) == []  # 3 steps redone, commits every 5: what a crash costs
    assert run(4) == [
        "attempt 1 resumed from step 4 and redid 13 steps, more than one commit interval (5 steps): the attempt "
        "before reached step 17"
    ]


def test_goodput_without_progress_reports_says_what_it_cannot_tell() -> None:
    clock = Goodput(started=0.0)
    clock.begin(0, 1.0).ended = 9.0
    figures = clock.figures(ended=10.0)
    assert figures["goodput"] is None and figures["wall_s"] == 10.0
    assert "no rank reported progress" in describe(figures)


def test_the_progress_file_carries_first_step_waits_saves_and_the_committed_step(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import time
        from launchers.elastic.ipc import progress
        progress.report(5)
        with progress.waiting():
            time.sleep(0.2)
        progress.saved(0.3, 4)
        progress.report(6)
        """
    )
    env = clean_env(MLAUNCH_RUN_ID="obs1", MLAUNCH_SHM_DIR=str(tmp_path), RANK="3")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=ROOT)
    (report,) = _read(tmp_path)
    assert (report.rank, report.step, report.first_step, report.committed_step) == (3, 6, 5, 4)
    assert report.waited == pytest.approx(0.2, abs=0.05)
    assert report.saving == pytest.approx(0.3)
    assert report.first_wall <= report.wall


def _read(shm: Path) -> list[progress.Progress]:
    return [p for p in map(progress.read, map(str, sorted(shm.glob("mlaunch.obs1.progress.*")))) if p]


# -- real runs ---------------------------------------------------------------------------------
def _job(tmp: Path, entry: Path, *, extra: str = "", env: dict[str, str] | None = None, args: str = "") -> Path:
    job = tmp / "job.yaml"
    env_yaml = json.dumps({"GLOO_SOCKET_IFNAME": "lo", **(env or {})})
    job.write_text(
        f"name: obs\nengine: pytorch\nentry: {entry}\nargs: [{args}]\nnodes: 2\nprocs_per_node: 2\n"
        f"env: {env_yaml}\nlog_dir: {tmp / 'logs'}\ncheckpoint: {{dir: {tmp / 'ckpt'}, grace_period: 10s}}\n{extra}"
    )
    return job


def _events(tmp: Path, kind: str | None = None) -> list[dict[str, Any]]:
    events = read_events(tmp / "logs" / "events.jsonl")
    return [e for e in events if kind is None or e["event"] == kind]


@needs_torch
@pytest.mark.slow
def test_a_straggler_appearing_mid_training_is_reported_then_reported_recovered(tmp_path: Path) -> None:
    job = _job(
        tmp_path,
        STRAGGLE,
        env={"STRAGGLE_RANK": "3", "STRAGGLE_FROM": "20", "STRAGGLE_TO": "45", "STRAGGLE_STEPS": "130"},
        extra="monitor: {straggler_factor: 1.5, straggler_steps: 5}\n",
    )
    result = run_mlaunch([str(job)], env=clean_env(), timeout=240)
    assert result.returncode == 0, result.stderr
    changes = [e for e in _events(tmp_path) if e["event"].startswith("straggler")]
    assert [(e["event"], e["rank"]) for e in changes] == [("straggler", 3), ("straggler_recovered", 3)], changes
    slow, recovered = changes
    assert 20 <= slow["step"] < 45 and recovered["step"] >= 45, changes
    assert slow["own_step_time_s"] >= 1.5 * slow["median_s"], slow
    assert re.search(
        r"straggler: rank 3 \(node 1, host [^)]*\) at step \d+: \d+ ms .* vs the job's median", result.stderr
    )
    assert "straggler recovered: rank 3" in result.stderr


@needs_torch
@pytest.mark.slow
def test_status_json_during_a_2x2_run_shows_every_rank_advancing(tmp_path: Path) -> None:
    job = _job(tmp_path, STRAGGLE, env={"STRAGGLE_STEPS": "400", "STRAGGLE_STEP": "0.03"})
    run = subprocess.Popen(
        [*mlaunch_cmd(), str(job)], env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        first = _status_with_steps(job, run, lambda steps: len(steps) == 4)
        later = _status_with_steps(job, run, lambda steps: len(steps) == 4 and all(steps[r] > first[r] for r in first))
        assert sorted(later) == [0, 1, 2, 3]
    finally:
        out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    final = json.loads(
        subprocess.run(
            [*mlaunch_cmd(), "status", "--json", str(job)], env=clean_env(), capture_output=True, text=True, check=True
        ).stdout
    )
    assert final["phase"] == "finished"
    assert {r["step"] for n in final["nodes"] for r in n["ranks"]} == {399}
    table = subprocess.run([*mlaunch_cmd(), "status", str(job)], env=clean_env(), capture_output=True, text=True)
    assert table.returncode == 0 and "obs: finished" in table.stdout and " 399 " in table.stdout, table


def _status_with_steps(job: Path, run: subprocess.Popen[str], good: Any) -> dict[int, int]:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()
        shown = subprocess.run(
            [*mlaunch_cmd(), "status", "--json", str(job)], env=clean_env(), capture_output=True, text=True
        )
        if shown.returncode == 0:
            data = json.loads(shown.stdout)
            steps = {r["rank"]: r["step"] for n in data["nodes"] for r in n["ranks"] if r["step"] is not None}
            if good(steps):
                return steps
        time.sleep(0.5)
    raise AssertionError("the status never showed what was expected")


def test_status_before_any_run_is_a_clear_error(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("entry: train.py\n")
    shown = subprocess.run([*mlaunch_cmd(), "status", str(job)], env=clean_env(), capture_output=True, text=True)
    assert shown.returncode == 2 and "no status yet" in shown.stderr and "Traceback" not in shown.stderr


def test_status_of_another_node_says_when_it_shows_that_nodes_ranks_only(tmp_path: Path) -> None:
    """Node 0's whole view did not come in time (a loaded node): the command says the table is partial."""
    from rich.console import Console

    from launchers.cli.commands.status import render

    def shown(scope: str) -> str:
        data = {"scope": scope, "job": "j", "phase": "running", "updated": time.time(), "nodes": []}
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(render(data, tmp_path / "status.json"))
        return console.export_text()

    assert "this node's ranks only: node 0's whole view did not come within 5s" in shown("node")
    assert "ranks only" not in shown("relay") and "ranks only" not in shown("job")


@needs_torch
@pytest.mark.slow
def test_goodput_of_a_run_with_a_kill_9_and_a_restart_accounts_for_the_recomputed_steps(tmp_path: Path) -> None:
    state = tmp_path / "chaos"
    state.mkdir()
    job = _job(
        tmp_path,
        CHAOS,
        args="'--steps', '30', '--save-every', '8', '--no-stage'",
        env={"CHAOS_PLAN": "3:13:kill9", "CHAOS_STATE": str(state), "CHAOS_STEP_SLEEP": "0.05"},
        extra="restart: {max_restarts: 1, backoff: 0s}\n",
    )
    result = run_mlaunch([str(job)], env=clean_env(), timeout=240)
    assert result.returncode == 0, result.stderr
    before, _, after = result.stdout.partition("resumed from step")
    reached = max(int(s) for s in re.findall(r"step (\d+) loss", before))
    resumed = int(re.match(r"\s*(\d+)", after).group(1))  # type: ignore[union-attr]
    assert resumed == 7 and reached >= 12, result.stdout
    (end,) = _events(tmp_path, "end")
    assert end["restarts"] == 1 and end["exit_code"] == 0
    assert end["recomputed_steps"] == reached - resumed, (end, reached, resumed)
    assert end["recomputed_s"] > 0 and end["checkpoint_stall_s"] > 0
    parts = ("productive_s", "recomputed_s", "checkpoint_stall_s", "startup_s", "restart_downtime_s", "other_s")
    assert sum(end[p] for p in parts) == pytest.approx(end["wall_s"], abs=0.01)
    assert f"recomputed {reached - resumed} steps" in result.stderr
    kinds = [e["event"] for e in _events(tmp_path)]
    assert kinds[0] == "start" and kinds[-1] == "end", kinds
    assert "failure" in kinds and "restart" in kinds and "checkpoint" in kinds, kinds
    assert kinds.index("failure") < kinds.index("restart") < len(kinds) - 1 - kinds[::-1].index("start"), kinds
    failure = _events(tmp_path, "failure")[0]
    assert failure["rank"] == 3 and failure["signal"] == 9, failure
    assert os.path.getsize(tmp_path / "logs" / "status.json") > 0
