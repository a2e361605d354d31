"""Grace budget: declared and measured step + save time against the grace period; timer chain.

The runtime check runs a real script under mlaunch that measures its own steps through the
elastic runtime; the declared checks go through ``mlaunch check`` and ``mlaunch run``.
"""

from __future__ import annotations

from pathlib import Path

from conftest import ROOT, run_mlaunch

from launchers.config.job import parse_job
from launchers.config.timers import KillTimers, timer_chain
from launchers.persist.grace_budget import MARGIN, Budget

BEHAVE = ROOT / "tests" / "scripts" / "behave.py"


def job_file(tmp_path: Path, checkpoint: str, extra: str = "", entry: Path = BEHAVE) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(f"entry: {entry}\nengine: pytorch\nlog_dir: {tmp_path}/logs\ncheckpoint: {{{checkpoint}}}\n{extra}")
    return job


def test_budget_arithmetic() -> None:
    assert Budget(2.0, 5.0, 10.0).needed == 7.0 + MARGIN
    assert Budget(2.0, 5.0, 10.0).fits and not Budget(2.0, 7.0, 10.0).fits


def test_declared_budget_that_fits_is_ok_in_check(tmp_path: Path) -> None:
    result = run_mlaunch(["check", str(job_file(tmp_path, "grace_period: 60s, step_time: 2s, save_time: 20s"))])
    assert result.returncode == 0, result.stderr
    assert "ok: grace budget (declared): step 2s + save 20s + margin 2s = 24s, which fits in" in result.stdout


def test_declared_budget_that_does_not_fit_warns_before_launch(tmp_path: Path) -> None:
    job = job_file(tmp_path, "grace_period: 10s, step_time: 3s, save_time: 12s")
    check = run_mlaunch(["check", str(job)])
    assert check.returncode == 0  # a warning, not an error: the job may still run
    assert "warning: grace budget (declared): step 3s + save 12s + margin 2s = 17s, which does NOT fit" in check.stdout
    assert "raise checkpoint.grace_period to at least 17s" in check.stdout
    run = run_mlaunch(["--engine", "pytorch", str(job)], timeout=60)
    assert run.returncode == 0
    first = run.stderr.splitlines()[0]
    assert first.startswith("mlaunch: warning: grace budget (declared in job.yaml)"), run.stderr


def test_timer_chain_is_consistent() -> None:
    job = parse_job("entry: t.py\ncheckpoint: {grace_period: 45s}\n", Path("/tmp/job.yaml"))
    # terminationGracePeriodSeconds: grace + kubernetes.termination_margin (15 s), what the manifests write
    assert timer_chain(job) == KillTimers(
        mlaunch_grace=45.0, torchrun_shutdown_timeout=45, termination_grace_period_seconds=60
    )


def test_torchrun_shutdown_timeout_longer_than_grace_is_flagged(tmp_path: Path) -> None:
    fine = run_mlaunch(["check", str(job_file(tmp_path, "grace_period: 20s", "pytorch: {style: torchrun}\n"))])
    assert "torchrun's shutdown timeout" not in fine.stdout
    (tmp_path / "b").mkdir()
    bad = job_file(
        tmp_path / "b", "grace_period: 20s", "pytorch: {style: torchrun}\nenv: {TORCH_ELASTIC_SHUTDOWN_TIMEOUT: '90'}\n"
    )
    result = run_mlaunch(["check", str(bad)])
    assert "warning: torchrun's shutdown timeout 90s is longer than the grace period 20s" in result.stdout


def test_preload_modules_that_cannot_be_imported_are_flagged(tmp_path: Path) -> None:
    result = run_mlaunch(["check", str(job_file(tmp_path, "grace_period: 20s", "preload: [json, no_such_mod_x]\n"))])
    assert "warning: preload: no_such_mod_x cannot be imported here" in result.stdout


def test_measured_step_time_that_does_not_fit_is_reported_while_running(tmp_path: Path) -> None:
    script = tmp_path / "slow_steps.py"
    script.write_text(
        "import time\nfrom launchers import elastic\n"
        "guard = elastic.install()\nckpt = elastic.Checkpointer()\n"
        "for step in range(6):\n"
        "    time.sleep(1.2)\n"
        "    ckpt.stage(step, {'step': step})\n"
        "    if guard.should_stop(step):\n"
        "        guard.exit()\n"
    )
    job = job_file(tmp_path, f"grace_period: 2s, dir: {tmp_path}/ckpt", entry=script)
    result = run_mlaunch(["--engine", "pytorch", str(job)], timeout=120)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "grace budget (measured step" in line]
    assert len(warnings) == 1, result.stderr  # said once
    assert "does NOT fit in the grace period of 2s" in warnings[0]
