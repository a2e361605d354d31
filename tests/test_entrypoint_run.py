"""The whole deployment, executed: `mlaunch wheel && mlaunch prestart && mlaunch entrypoint`, then
`bash entrypoint.sh` as a platform would start it, on the example job (2 nodes × 2 processes, gloo).

A fresh virtual environment stands for the node's Python (found as ``python3`` on PATH, as a
platform image would have it). The generated pre-start installs, offline, the wheel from
``mlaunch wheel``, a vendor wheel built here, and ``requirements.txt`` (torch, numpy) from a
wheelhouse; the entrypoint runs the example to exit 0; a second pre-start run changes nothing.
Then SIGTERM to the entrypoint's process: mlaunch (the same process, exec'd) forwards it, every
worker gets it, the example saves its dying checkpoint and the run exits 143; the next start
resumes from that checkpoint and ends with the uninterrupted run's checksum.

The vendor wheel is a probe standing in for ``mindx_elastic``: a ``.pth`` file makes every worker
that starts on the venv's Python note it, and note each SIGTERM it receives (chained before any
handler the training script installs). Only it can tell from outside which process got a signal.
Slow (pip installs torch into the venv): run with --slow, MLAUNCH_SLOW=1 or CI=true.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, run_mlaunch
from test_prestart_fixtures import (
    make_venv,
    pip_freeze,
    run_script,
    script_env,
    shellcheck,
    vendor_wheel,
    wheel_requirements,
    wheelhouse,
)

pytestmark = pytest.mark.slow

STEPS = 200
NPROCS = 4

PROBE = '''\
"""Notes, for the test, each worker that starts and each SIGTERM it gets (a stand-in vendor wheel)."""
import os
import signal
import sys

_dir, _rank = os.environ.get("VENDOR_PROBE_DIR"), os.environ.get("RANK")
if _dir and _rank is not None and os.environ.get("MLAUNCH_RUN_ID"):
    _install = signal.signal

    def _note(kind):
        with open(os.path.join(_dir, "%s-rank%s-%d" % (kind, _rank, os.getpid())), "w") as fh:
            fh.write(sys.executable)

    def _chained(handler):
        def on_sigterm(signum, frame):
            _note("sigterm")
            if callable(handler):
                return handler(signum, frame)
            _install(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        return on_sigterm

    def _signal(signum, handler):
        if signum == signal.SIGTERM and handler is not signal.SIG_IGN:
            return _install(signum, _chained(handler))
        return _install(signum, handler)

    signal.signal = _signal
    _install(signal.SIGTERM, _chained(signal.SIG_DFL))
    _note("start")
'''


@dataclass
class Deployment:
    code: Path
    venv_python: Path
    env: dict[str, str]
    probe: Path


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Deployment:
    root = tmp_path_factory.mktemp("deployment")
    code = root / "code"
    shutil.copytree(EXAMPLES / "pytorch", code, ignore=shutil.ignore_patterns("output", "__pycache__"))

    made = run_mlaunch(["wheel", "-o", str(code / "dist")])
    assert made.returncode == 0, made.stderr
    mlaunch_wheel = Path(made.stdout.strip())
    vendor_wheel(
        code / "vendor",
        "vendor-probe",
        "0.0.1",
        {
            "vendor_probe/__init__.py": "",
            "vendor_probe/_boot.py": PROBE,
            "vendor_probe.pth": "import vendor_probe._boot\n",
        },
    )
    (code / "requirements.txt").write_text("torch==2.13.0\nnumpy\n")
    house = wheelhouse(
        request.config.cache.mkdir("mlaunch-wheelhouse"), [*wheel_requirements(mlaunch_wheel), "torch==2.13.0", "numpy"]
    )

    job = yaml.safe_load((code / "job.yaml").read_text())
    job["args"] = ["--steps", str(STEPS)]
    job["prestart"] = {
        "wheels": ["dist/mlaunch-*.whl", "vendor/vendor_probe-*.whl"],
        "requirements": "requirements.txt",
        "offline": True,
        "find_links": [str(house)],
        "env": {"GLOG_v": "2"},
    }
    (code / "job.yaml").write_text(yaml.safe_dump(job))
    for command in ("prestart", "entrypoint"):
        result = run_mlaunch([command, str(code / "job.yaml")])
        assert result.returncode == 0, result.stderr
    shellcheck(code / "ma_pre_start.sh", code / "entrypoint.sh")

    venv_python = make_venv(root / "venv")
    probe = root / "probe"
    probe.mkdir()
    env = script_env(venv_python, root, VENDOR_PROBE_DIR=str(probe))
    del env["MLAUNCH_PYTHON"]  # the node's python3 is found on PATH, as on a platform image
    env["PATH"] = f"{venv_python.parent}:{env['PATH']}"
    return Deployment(code, venv_python, env, probe)


@pytest.fixture(scope="module")
def first_run(deployment: Deployment) -> dict[str, str]:
    """`bash entrypoint.sh`: pre-start (installs everything), then the example to the end."""
    result = run_script(deployment.code / "entrypoint.sh", deployment.env, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    checksum = re.search(r"final-checksum ([0-9a-f]+)", result.stdout)
    assert checksum, result.stdout[-3000:]
    return {"stdout": result.stdout, "stderr": result.stderr, "checksum": checksum.group(1)}


def _probe_notes(probe: Path, kind: str) -> dict[int, str]:
    notes = {}
    for path in probe.glob(f"{kind}-rank*"):
        rank = int(path.name.split("-")[1].removeprefix("rank"))
        notes[rank] = path.read_text()
    return notes


def test_entrypoint_installs_the_wheels_and_runs_the_example(deployment: Deployment, first_run: dict[str, str]) -> None:
    out = first_run["stdout"]
    for line in ("Start to install mlaunch-0.1.0-py3-none-any.whl", "Start to install vendor_probe-0.0.1"):
        assert f"[ma-pre-start] {line}" in out
    assert "[ma-pre-start] pip install -r 'requirements.txt'" in out
    assert f"[ma-pre-start] python: {deployment.venv_python}3" in out
    assert "[mlaunch-entrypoint] exec" in out and f"{deployment.venv_python.parent}/mlaunch" in out
    assert "job finished: all 4 processes exited 0" in first_run["stderr"]
    frozen = "\n".join(pip_freeze(deployment.venv_python))
    for package in ("mlaunch==0.1.0", "vendor-probe==0.0.1", "torch==2.13.0", "numpy=="):
        assert package in frozen
    # every worker ran on the venv's Python, where the pre-start installed the vendor wheel
    started = _probe_notes(deployment.probe, "start")
    assert sorted(started) == list(range(NPROCS))
    assert set(started.values()) == {str(deployment.venv_python) + "3"}


def test_second_prestart_run_is_a_no_op(deployment: Deployment, first_run: dict[str, str]) -> None:
    def state() -> tuple[list[str], dict[str, bytes]]:
        files = {
            str(p.relative_to(deployment.code)): p.read_bytes()
            for p in sorted(deployment.code.rglob("*"))
            if p.is_file() and "output" not in p.relative_to(deployment.code).parts
        }
        return pip_freeze(deployment.venv_python), files

    before = state()
    again = run_script(deployment.code / "ma_pre_start.sh", deployment.env, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to install" in again.stdout and "Processing" not in again.stdout
    assert state() == before


def test_sigterm_saves_a_dying_checkpoint_exits_143_and_the_next_start_resumes(
    deployment: Deployment, first_run: dict[str, str]
) -> None:
    from launchers.elastic.format import layout

    ckpt_dir = deployment.code / "output" / "ckpt"
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    shutil.rmtree(deployment.code / "output" / "logs", ignore_errors=True)  # the first run's logs
    for note in deployment.probe.iterdir():
        note.unlink()
    log0 = deployment.code / "output" / "logs" / "rank0.log"
    proc = subprocess.Popen(
        ["bash", str(deployment.code / "entrypoint.sh")],
        env=deployment.env,
        cwd=deployment.code.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (log0.exists() and "step 3 " in log0.read_text()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "training never reached step 3"
            time.sleep(0.05)
        assert len(_probe_notes(deployment.probe, "start")) == NPROCS
        os.kill(proc.pid, signal.SIGTERM)  # the entrypoint's process: bash exec'd mlaunch in it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, out[-3000:] + err[-3000:]
    assert f"received SIGTERM; forwarding it to {NPROCS} processes" in err
    assert "is over; SIGKILL" not in err  # every rank saved and left within the grace period
    assert sorted(_probe_notes(deployment.probe, "sigterm")) == list(range(NPROCS))

    committed = layout.committed(ckpt_dir)
    assert committed, f"no committed checkpoint in {ckpt_dir}: {sorted(p.name for p in ckpt_dir.glob('*'))}"
    dying = committed[0]
    assert 3 <= dying.step < STEPS - 1
    assert dying.world_size == NPROCS
    assert all(dying.shard(rank).exists() for rank in range(NPROCS))

    resumed = run_script(deployment.code / "entrypoint.sh", deployment.env, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed from step {dying.step}" in resumed.stdout
    assert f"final-checksum {first_run['checksum']}" in resumed.stdout  # nothing was lost
