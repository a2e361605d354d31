"""A stop signal during mlaunch's own start-up is kept, not lost.

As a container's PID 1, mlaunch gets no default signal actions: a SIGTERM that arrives
before a handler exists is dropped by the kernel, and the platform's stop would be ignored
until its kill timer fires. These tests deliver the signal at two moments, from inside the
real console entry point (``launchers.cli.main.main`` with ``sys.argv``), by wrapping one function
the start-up calls — the deterministic way to hit a window that lasts milliseconds:

- while the job is being planned: nothing is launched (the start file would leave a mark)
  and mlaunch exits 128 + the signal;
- after the plan, before the supervisor's handlers exist: the workers start, are stopped by
  the recorded signal, and mlaunch exits 143 without waiting for them to finish on their own.

The last test does the first as PID 1 of a new PID namespace, where an unhandled SIGTERM
would be ignored rather than kill the process.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

START_FILE = """\
import os, sys, time
open(os.path.join(sys.argv[1], "launched-rank" + os.environ["RANK"]), "w").close()
time.sleep(60)
"""

WRAPPER = """\
import os, signal, sys
import launchers.run.runner as runner
from launchers.cli import main as cli

where, sig = sys.argv[1], getattr(signal, sys.argv[2])
real = getattr(runner, where)

def signalled(*args, **kwargs):
    os.kill(os.getpid(), sig)  # arrives while mlaunch is starting up
    return real(*args, **kwargs)

setattr(runner, where, signalled)
sys.argv = ["mlaunch", *sys.argv[3:]]
cli.main()
"""


def _job(tmp_path: Path) -> Path:
    (tmp_path / "start.py").write_text(START_FILE)
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: early\nentry: {tmp_path / 'start.py'}\nargs: ['{tmp_path}']\nnodes: 1\nprocs_per_node: 2\n"
        f"log_dir: {tmp_path / 'logs'}\ncheckpoint: {{grace_period: 5s}}\n"
    )
    return job


def _run(tmp_path: Path, where: str, sig: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    cmd = [*(prefix or []), sys.executable, str(wrapper), where, sig, "--engine", "pytorch", str(_job(tmp_path))]
    return subprocess.run(cmd, env=clean_env(), cwd=ROOT, text=True, capture_output=True, timeout=120)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_stop_signal_while_planning_launches_nothing(tmp_path: Path, sig: str) -> None:
    done = _run(tmp_path, "make_plan", sig)
    number = int(getattr(signal, sig))
    assert done.returncode == 128 + number, done.stderr
    assert f"stopped by {sig} before anything was launched" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("launched-rank*"))


def test_sigterm_before_supervisor_handlers_stops_the_started_workers(tmp_path: Path) -> None:
    start = time.monotonic()
    done = _run(tmp_path, "become_subreaper", "SIGTERM")
    took = time.monotonic() - start
    assert done.returncode == 143, done.stderr
    assert took < 30, f"mlaunch waited {took:.1f}s: the early SIGTERM was not acted on"
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_early_sigterm_is_kept_as_pid1(tmp_path: Path) -> None:
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare --pid needs root / CAP_SYS_ADMIN")
    done = _run(tmp_path, "make_plan", "SIGTERM", prefix=["unshare", "--pid", "--fork", "--mount-proc"])
    assert done.returncode == 143, done.stderr
    assert "stopped by SIGTERM before anything was launched" in done.stderr
    assert not list(tmp_path.glob("launched-rank*"))
