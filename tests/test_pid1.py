"""mlaunch as PID 1: the generated entrypoint run as the first process of a new PID namespace.

``unshare --pid --fork --mount-proc bash entrypoint.sh``: bash is PID 1 of the namespace and
execs mlaunch, so mlaunch is PID 1 — a container without an init. Checked from outside, on the
host's /proc: a grandchild orphaned by a worker is re-parented to mlaunch and reaped when it
exits (no zombie), SIGTERM sent to PID 1 from the parent namespace reaches every worker, and
mlaunch exits 143. Needs root (CAP_SYS_ADMIN) for unshare; skipped where that is refused.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import run_mlaunch
from test_prestart_fixtures import script_env


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _unshare_works(), reason="unshare --pid needs root / CAP_SYS_ADMIN")

WORKER = """\
import json, os, signal, sys, time
rank, out = os.environ["RANK"], os.environ["PROBE_DIR"]

def on_term(signum, frame):
    open(os.path.join(out, "term-rank" + rank), "w").close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)

signal.signal(signal.SIGTERM, on_term)
if rank == "0":
    middle = os.fork()
    if middle == 0:  # start a grandchild and leave it orphaned
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "2"])
        os._exit(0)
    os.waitpid(middle, 0)
with open(os.path.join(out, "ready-rank" + rank + ".tmp"), "w") as fh:
    json.dump({"pid": os.getpid(), "ppid": os.getppid()}, fh)
os.replace(os.path.join(out, "ready-rank" + rank + ".tmp"), os.path.join(out, "ready-rank" + rank + ".json"))
while True:
    time.sleep(1)
"""


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def _stat(pid: int) -> tuple[str, str] | None:
    """(command name, state) of a process, None once it is gone (reaped)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    return name, raw[raw.rindex(")") + 2 :].split()[0]


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_mlaunch_as_pid1_reaps_orphans_and_forwards_sigterm(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "worker.py").write_text(WORKER)
    job = code / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "pid1",
                "engine": "pytorch",
                "entry": "worker.py",
                "nodes": 1,
                "procs_per_node": 2,
                "checkpoint": {"grace_period": "10s"},
            }
        )
    )
    made = run_mlaunch(["entrypoint", str(job)])
    assert made.returncode == 0, made.stderr
    probe = tmp_path / "probe"
    probe.mkdir()
    env = script_env(Path(sys.executable), tmp_path, PROBE_DIR=str(probe))
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "bash", str(code / "entrypoint.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: len(list(probe.glob("ready-rank*.json"))) == 2 or proc.poll() is not None, 60, "workers")
        assert proc.poll() is None, proc.communicate()
        (pid1,) = _children(proc.pid)
        status = Path(f"/proc/{pid1}/status").read_text()
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[1:]
        assert nspid == [str(pid1), "1"], status  # mlaunch is PID 1 of the namespace
        for rank in (0, 1):
            assert '"ppid": 1}' in (probe / f"ready-rank{rank}.json").read_text()

        # the orphaned grandchild was re-parented to PID 1 (mlaunch) ...
        orphans: list[int] = []

        def adopted() -> bool:
            orphans[:] = [c for c in _children(pid1) if (_stat(c) or ("", ""))[0] == "sleep"]
            return bool(orphans)

        _wait_for(adopted, 3, "the orphaned grandchild to be adopted by mlaunch")
        # ... and reaped when it exits: it disappears instead of staying a zombie
        _wait_for(lambda: _stat(orphans[0]) is None, 10, f"pid {orphans[0]} to be reaped (state {_stat(orphans[0])})")
        zombies = [c for c in _children(pid1) if (_stat(c) or ("", ""))[1] == "Z"]
        assert not zombies

        # SIGTERM from the parent namespace (as a container runtime sends it) reaches PID 1, which
        # has a handler for it, and through it every worker
        children = _children(pid1)
        os.kill(pid1, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, out + err
    assert sorted(p.name for p in probe.glob("term-rank*")) == ["term-rank0", "term-rank1"]
    assert "received SIGTERM; forwarding it to 2 processes" in err
    assert "grace period" not in err.split("received SIGTERM", 1)[1]  # no SIGKILL was needed
    assert all(_stat(c) is None for c in children)
