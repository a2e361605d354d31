"""``mlaunch entrypoint``: the container's start script, generated, shellchecked and run.

Each run is real: bash runs the generated entrypoint, which runs the generated pre-start, loads
the env it left, and execs mlaunch, which starts worker processes that write down what they got.
The interpreter is the one running these tests (its mlaunch is the checkout), except where a test
needs a Python without mlaunch, or a venv that only sees it through the test interpreter's site-packages.
No pre-start here installs a wheel (that is tests/test_entrypoint_run.py), so the developer's
environment is never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_mlaunch, venv_seeing_this_python
from test_prestart_fixtures import DUMP_WORKER, read_dumps, run_script, script_env, shellcheck

WEIRD = 'it\'s "quoted" $(touch PWNED) `touch PWNED`; touch PWNED\nline two ünïcødé'


def make_job(code: Path, prestart: dict[str, Any] | None = None, **fields: Any) -> Path:
    code.mkdir(parents=True, exist_ok=True)
    (code / "dump.py").write_text(DUMP_WORKER)
    data: dict[str, Any] = {
        "name": "entrypoint-test",
        "engine": "pytorch",
        "entry": "dump.py",
        "args": ["--job-arg", "a b"],
        "nodes": 1,
        "procs_per_node": 2,
        "checkpoint": {"grace_period": "5s"},
        **fields,
    }
    if prestart is not None:
        data["prestart"] = prestart
    job = code / "job.yaml"
    job.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return job


def generate(job: Path, *args: str, prestart: bool = True) -> Path:
    if prestart:
        made = run_mlaunch(["prestart", str(job)])
        assert made.returncode == 0, made.stderr
    result = run_mlaunch(["entrypoint", str(job), *args])
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


def dump_env(tmp_path: Path, python: Path | str = sys.executable, **extra: str) -> dict[str, str]:
    dump = tmp_path / "dumps"
    dump.mkdir(exist_ok=True)
    return script_env(
        Path(python),
        tmp_path,
        DUMP_DIR=str(dump),
        DUMP_KEYS='["GLOG_v", "WEIRD", "MLAUNCH_PYTHON", "RANK", "WORLD_SIZE"]',
        **extra,
    )


@pytest.mark.parametrize(
    "layout", ["default", "script elsewhere", "custom prestart", "job python", "no engine flag needed"]
)
def test_generated_entrypoint_passes_shellcheck(tmp_path: Path, layout: str) -> None:
    code = tmp_path / "code $(x) `y`"
    job = make_job(code, {"env": {"WEIRD": WEIRD}}, python="/opt/p y/python3" if layout == "job python" else None)
    args: list[str] = []
    if layout == "script elsewhere":
        (tmp_path / "deploy").mkdir()
        args = ["-o", str(tmp_path / "deploy" / "start.sh")]
    if layout == "custom prestart":
        args = ["--prestart", str(code / "setup" / "pre.sh")]
    script = generate(job, *args)
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
    assert 'exec "${command[@]}"' in text and '"$job_file" "$@")' in text
    shellcheck(script)


def test_runs_prestart_then_execs_mlaunch_with_every_argument(tmp_path: Path) -> None:
    code = tmp_path / "code"
    job = make_job(code, {"env": {"GLOG_v": "2", "WEIRD": WEIRD}})
    script = generate(job)
    env = dump_env(tmp_path)
    appended = ["--data_url=/cache/data set", "$(touch PWNED)", "ünï"]
    proc = subprocess.Popen(
        ["bash", str(script), *appended],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    dumps = read_dumps(tmp_path / "dumps")
    assert sorted(dumps) == [0, 1]
    for rank, record in dumps.items():
        assert record["argv"] == ["--job-arg", "a b", *appended]
        env_seen = record["env"]
        assert isinstance(env_seen, dict)
        assert env_seen["GLOG_v"] == "2" and env_seen["WEIRD"] == WEIRD and env_seen["RANK"] == str(rank)
        assert record["ppid"] == proc.pid  # bash exec'd mlaunch: the entrypoint's process is mlaunch
        assert os.path.realpath(str(record["executable"])) == os.path.realpath(sys.executable)
        assert record["cwd"] == str(code)
    assert "[ma-pre-start] End" in out
    assert "[mlaunch-entrypoint] exec" in out and "job finished" in err
    assert not list(tmp_path.rglob("PWNED"))


def test_the_job_exit_code_is_the_entrypoints(tmp_path: Path) -> None:
    script = generate(make_job(tmp_path / "code"), prestart=False)
    result = run_script(script, dump_env(tmp_path, EXIT_CODE="3"), timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "exited with code 3" in result.stderr


def test_a_failing_prestart_stops_before_mlaunch(tmp_path: Path) -> None:
    script = generate(make_job(tmp_path / "code", {"commands": ["echo preparing; exit 7"]}))
    result = run_script(script, dump_env(tmp_path), timeout=120)
    assert result.returncode == 1
    assert "[ma-pre-start] error: command failed: echo preparing; exit 7" in result.stderr
    assert "[mlaunch-entrypoint] error:" in result.stderr and "failed with exit code 1" in result.stderr
    assert read_dumps(tmp_path / "dumps") == {}


def test_sigterm_during_prestart_stops_it_and_exits_143(tmp_path: Path) -> None:
    code = tmp_path / "code"
    script = generate(make_job(code, {"commands": ["echo $$ > sleeper.pid; exec sleep 60"]}))
    proc = subprocess.Popen(["bash", str(script)], env=dump_env(tmp_path), stdout=subprocess.PIPE, text=True)
    pid_file = code / "sleeper.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, "the pre-start command never started"
        time.sleep(0.05)
    sleeper = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    deadline = time.monotonic() + 5
    while _alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(sleeper), "the pre-start's command survived the entrypoint"
    assert read_dumps(tmp_path / "dumps") == {}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_python_without_mlaunch_is_a_clear_error(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    script = generate(make_job(tmp_path / "code"), prestart=False)
    result = run_script(script, dump_env(tmp_path, bare / "bin" / "python"), timeout=60)
    assert result.returncode == 1
    assert f"mlaunch is not installed for {bare / 'bin' / 'python'}" in result.stderr
    assert "mlaunch wheel -o dist" in result.stderr


def test_mlaunch_runs_on_the_chosen_python_even_when_its_script_belongs_to_another(tmp_path: Path) -> None:
    """A venv that sees mlaunch only through the test interpreter's site-packages: the `mlaunch`
    script on disk would start that other interpreter, so the entrypoint runs mlaunch through the
    venv's python, and the workers run on the venv's python too (where its pre-start installed things)."""
    python = venv_seeing_this_python(tmp_path / "venv")
    script = generate(make_job(tmp_path / "code"), prestart=False)
    result = run_script(script, dump_env(tmp_path, python), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"exec '{python}' '-c'" in result.stdout
    for record in read_dumps(tmp_path / "dumps").values():
        assert record["executable"] == str(python)


def test_entrypoint_user_errors(tmp_path: Path) -> None:
    job = make_job(tmp_path / "code")
    data = yaml.safe_load(job.read_text())
    del data["engine"]
    job.write_text(yaml.safe_dump(data))
    no_engine = run_mlaunch(["entrypoint", str(job)])
    assert no_engine.returncode == 2 and "no engine given" in no_engine.stderr
    unknown = run_mlaunch(["entrypoint", str(job), "--engine", "jax"])
    assert unknown.returncode == 2 and "unknown engine 'jax'" in unknown.stderr
    assert not (tmp_path / "code" / "entrypoint.sh").exists()
    ok = run_mlaunch(["entrypoint", str(job), "--engine", "pytorch", "-o", "-"])
    assert ok.returncode == 0 and "--engine pytorch" in ok.stdout
