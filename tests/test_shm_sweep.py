"""Shared memory that dead runs left is removed by the next mlaunch; a live run's is never touched.

Real processes hold (or held) each run's lock (``flock`` on ``mlaunch.<run id>.alive``) and are
SIGKILLed, as a container's cgroup kill or a test's timeout does to mlaunch and its watchdog at once.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd

from launchers.run import shm_sweep

HOLDER = """
import os, sys, time
from pathlib import Path
from launchers.run import shm_sweep
run, shm = sys.argv[1], Path(os.environ["MLAUNCH_SHM_DIR"])
assert shm_sweep.hold(run) is not None
for name in (f"mlaunch.{run}.rank0", f"mlaunch.{run}.progress.{os.getpid()}", f".mlaunch.{run}.rank1.99.new"):
    (shm / name).write_bytes(b"x" * 64)
print("holding", flush=True)
time.sleep(3600)
"""


def holder(shm: Path, run: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, run],
        env=clean_env(MLAUNCH_SHM_DIR=str(shm), PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def files_of(shm: Path, run: str) -> list[str]:
    return sorted(name for name in os.listdir(shm) if run in name)


def test_a_dead_runs_files_go_a_live_runs_stay_and_a_run_without_a_lock_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    live, dead, unlocked, own = (secrets.token_hex(16) for _ in range(4))
    keep = holder(tmp_path, live)
    gone = holder(tmp_path, dead)
    (tmp_path / f"mlaunch.{unlocked}.rank0").write_bytes(b"x")  # an mlaunch before the lock: not judged
    (tmp_path / f"mlaunch.{own}.rank0").write_bytes(b"x")
    (tmp_path / "unrelated").write_bytes(b"x")
    try:
        assert shm_sweep.sweep(own) == (0, 0)  # both holders alive
        gone.kill()
        gone.wait()
        assert len(files_of(tmp_path, dead)) == 4
        assert shm_sweep.sweep(own) == (4, 1)
        assert files_of(tmp_path, dead) == []
        assert len(files_of(tmp_path, live)) == 4 and files_of(tmp_path, unlocked) and files_of(tmp_path, own)
        assert (tmp_path / "unrelated").exists()
    finally:
        keep.kill()
        keep.wait()
    assert shm_sweep.sweep(own) == (4, 1)


GUARDED_RANK = """
import time
from launchers import elastic
elastic.install()
elastic.heartbeat(0)  # its progress file, in shared memory
print("stepping", flush=True)
time.sleep(3600)
"""


def test_the_next_mlaunch_removes_what_a_whole_group_sigkill_left(tmp_path: Path) -> None:
    """mlaunch and its watchdog SIGKILLed together leave the run's files; the next mlaunch removes them, says so."""
    shm = tmp_path / "shm"
    shm.mkdir()
    (tmp_path / "rank.py").write_text(textwrap.dedent(GUARDED_RANK))
    job = tmp_path / "job.yaml"
    job.write_text(f"name: sweep\nentry: rank.py\nnodes: 1\nprocs_per_node: 2\nlog_dir: {tmp_path / 'logs'}\n")
    env = clean_env(MLAUNCH_SHM_DIR=str(shm))
    first = subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job)], env=env, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert first.stdout is not None
    while "stepping" not in first.stdout.readline():
        assert first.poll() is None
    os.killpg(first.pid, signal.SIGKILL)  # mlaunch and its watchdog at once; the ranks follow (parent death)
    first.wait()
    time.sleep(0.5)  # the ranks follow their parent (parent-death signal): nobody is left to clean up
    left = sorted(os.listdir(shm))
    assert any(name.endswith(".alive") for name in left) and any(".progress." in name for name in left), left
    (tmp_path / "rank.py").write_text("print('done')\n")
    second = subprocess.run(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job)], env=env, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stdout + second.stderr
    said = f"removed {len(left)} shared-memory file(s) that 1 dead run(s) left in {shm}"
    assert said in second.stdout + second.stderr, second.stdout + second.stderr
    assert os.listdir(shm) == [], os.listdir(shm)  # the second run's own lock went with its watchdog
