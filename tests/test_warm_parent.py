"""Standbys forked from a warm parent, and a preload list that learns (issue 26).

Real processes throughout: a warm parent that imported ``preload:``, standbys it forks (which
mlaunch adopts), the supervisor that hands them a worker; the tests compare what a script sees
in a warm rank with what it sees in a cold one, watch mlaunch fall back when a preload module
starts a thread, and (slow) watch a DDP job teach the warm parent ``torch._dynamo``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, run_mlaunch, torch_available
from test_standby import Capture, warm_up

from launchers.elastic.ipc import import_report
from launchers.plan import ProcessSpec
from launchers.run.signal_router import SignalRouter
from launchers.run.supervisor import Output, Stopping, Supervisor
from launchers.standby.preload_learning import PreloadLearner
from launchers.standby.standby_pool import StandbyPool

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import wait_for  # noqa: E402

SEES = """\
import ctypes, json, os, resource, signal, sys
libc = ctypes.CDLL(None)
deathsig = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(deathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
fds = [fd for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")]  # less listdir's own
print(json.dumps({
    "env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv, "name": __name__, "path0": sys.path[0],
    "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
    "handlers": {s.name: repr(signal.getsignal(s)) for s in signal.valid_signals() if isinstance(s, signal.Signals)},
    "kernel": {k: status[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt", "Umask")},
    "fds": sorted(fds), "deathsig": deathsig.value, "stdin": sys.stdin.read(),
    "session": [os.getpid() == os.getpgid(0) == os.getsid(0), os.getppid()],
    "marked": b"MLAUNCH_RUN_ID=wpsame" in open("/proc/self/environ", "rb").read().split(b"\\0"),
    "pid": os.getpid(),
}), flush=True)
"""


def sees(tmp_path: Path, pool: StandbyPool | None, spec: ProcessSpec) -> dict:
    out = Capture()
    with SignalRouter() as signals:
        outcome = Supervisor(
            [spec], run_id="wpsame", signals=signals, standbys=pool, stopping=Stopping(5), output=Output(out, Capture())
        ).run()
    assert outcome.status == "succeeded", out.data
    return json.loads(out.data.decode().split("] ", 1)[1])


def test_a_forked_standby_runs_the_rank_as_a_fresh_process_would(tmp_path: Path) -> None:
    """Same env, cwd, rlimits, signal dispositions and mask, umask, fds, session, parent-death signal, marker.

    mlaunch's limits, mask and umask change *after* the standby was forked: a cold worker
    started now inherits the new ones, and so must the warm one.
    """
    (tmp_path / "sees.py").write_text(SEES)
    argv = [sys.executable, "-u", str(tmp_path / "sees.py"), "--flag"]
    spec = ProcessSpec(0, 0, argv, {"ANSWER": "42"}, str(tmp_path))
    pool = StandbyPool(["decimal"], run_id="wpsame", delay=0)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    old_umask = os.umask(0o022)
    try:
        warm_up(pool, [spec])
        assert pool.fork and pool.parents, "the standby was not forked from a warm parent"
        forked_pid = pool.standbys[0].pid
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile[0] - 7, nofile[1]))
        os.umask(0o027)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGWINCH])
        warm = sees(tmp_path, pool, spec)
        cold = sees(tmp_path, None, spec)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGWINCH])
        os.umask(old_umask)
        resource.setrlimit(resource.RLIMIT_NOFILE, nofile)
        pool.close()
    assert warm["pid"] == forked_pid and pool.handed_off == 1 and cold["pid"] != forked_pid
    assert warm["rlimits"]["RLIMIT_NOFILE"][0] == nofile[0] - 7 and warm["kernel"]["Umask"] == "0027"
    assert int(warm["kernel"]["SigBlk"], 16) & (1 << (signal.SIGWINCH - 1))
    assert warm["session"] == [True, os.getpid()] and warm["deathsig"] == signal.SIGKILL and warm["marked"]
    for key in ("env", "cwd", "argv", "name", "path0", "rlimits", "handlers", "kernel", "fds", "deathsig", "stdin"):
        assert warm[key] == cold[key], key
    assert warm["fds"] == ["0", "1", "2"]
    assert warm["env"]["ANSWER"] == "42" and warm["session"] == cold["session"]


THREADED = """\
import threading, time
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()  # a pool some libraries start at import
"""

FLAKY = """\
import os, sys, time
attempt = os.environ['MLAUNCH_RESTART_COUNT']
print('attempt', attempt, 'preloaded', 'threaded_helper' in sys.modules, flush=True)
if attempt == '0':
    time.sleep(4)  # long enough for the standbys to get ready
    sys.exit(7 if os.environ['RANK'] == '1' else 0)
"""


def test_a_preload_module_that_starts_a_thread_makes_mlaunch_fall_back(tmp_path: Path) -> None:
    """Forking a process with a second thread is unsafe: mlaunch names the module and starts standbys as before."""
    (tmp_path / "threaded_helper.py").write_text(THREADED)
    (tmp_path / "flaky.py").write_text(FLAKY)
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: flaky.py\nprocs_per_node: 2\nlog_dir: {tmp_path}/logs\npreload: [threaded_helper]\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\ncheckpoint: {{grace_period: 5s, dir: {tmp_path}/ckpt}}\n"
    )
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=clean_env(PYTHONPATH=str(tmp_path)), timeout=120)
    assert result.returncode == 0, result.stderr
    assert (
        "preload: importing threaded_helper started 1 thread(s); standbys are not forked from a warm parent"
        in result.stderr
    )
    assert "restarting the group (1/1) in 0s from 2 warm standbys" in result.stderr
    assert sorted(line for line in result.stdout.splitlines() if "attempt 1" in line) == [
        "[rank 0] attempt 1 preloaded True",  # from standbys that imported the module themselves
        "[rank 1] attempt 1 preloaded True",
    ]


def test_a_rank_reports_installed_modules_only(tmp_path: Path) -> None:
    """The rank side of learning: stdlib and site-packages modules are reported, the job's own never."""
    (tmp_path / "jobhelper.py").write_text("import os\nRANK = os.environ.get('RANK')\n")
    report = tmp_path / "report.imports"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import jobhelper, json, decimal, pydantic\n"
        "from launchers.elastic.ipc import import_report\n"
        "assert import_report.write(sys.argv[2])\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path), str(report)], check=True, timeout=60)
    names = {name for name, _ in import_report.read(str(report))}
    assert {"json", "json.decoder", "decimal", "pydantic"} <= names
    assert "jobhelper" not in names and "__main__" not in names


def test_learning_never_takes_modules_from_the_jobs_directories(tmp_path: Path, monkeypatch) -> None:
    """mlaunch's side checks again: a reported module whose file is in the code dir is not learned
    (unless it sits in a site-packages there: a virtual environment inside the code dir)."""
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    code = tmp_path / "code"
    (tmp_path / "mlaunch.wplearn.progress.123.imports").write_text(
        "torch\t/venv/lib/python3.11/site-packages/torch/__init__.py\n"
        "sympy\t/venv/lib/python3.11/site-packages/sympy/__init__.py\n"
        f"jobhelper\t{code}/jobhelper.py\n"
        f"vendored\t{code}/.venv/lib/python3.11/site-packages/vendored/__init__.py\n"
    )
    said: list[str] = []
    learner = PreloadLearner("wplearn", said.append)
    assert learner.new_modules({"torch"}, [str(code)]) == ["sympy", "vendored"]
    assert learner.new_modules({"torch"}, [str(code)], now=time.monotonic() + 5) == []  # each is asked for once
    learner.imported({"imported": ["sympy"], "skipped": {}})
    learner.imported({"imported": ["sympy"], "skipped": {}})
    assert len(said) == 1 and "the ranks also import sympy" in said[0]  # said once


def test_learning_stops_after_a_module_made_forking_unsafe(tmp_path: Path, monkeypatch) -> None:
    """A refused module is often not the culprit but what its import pulled in (torch's OpenMP pool with
    OMP_NUM_THREADS unset): the next module would pull it in again, so learning stops at the first refusal
    instead of restarting the warm parent for each module the ranks import (seen: four in one job)."""
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    reports = tmp_path / "mlaunch.wpstop.progress.1.imports"
    reports.write_text("sympy\t/venv/lib/python3.11/site-packages/sympy/__init__.py\n")
    said: list[str] = []
    learner = PreloadLearner("wpstop", said.append)
    assert learner.new_modules(set(), []) == ["sympy"]
    learner.refuse("sympy", "importing sympy started 1 thread(s)")
    reports.write_text(reports.read_text() + "decimal\t/usr/lib/python3.11/decimal.py\n")
    assert learner.new_modules(set(), [], now=time.monotonic() + 5) == []
    assert learner.refused == {"sympy"} and "learns no more" in said[-1] and "sympy" in said[-1]


def test_a_learned_import_that_fails_half_way_makes_the_warm_parent_unsafe(tmp_path: Path) -> None:
    """A package whose ``__init__`` raised after importing a submodule leaves that submodule orphaned in
    ``sys.modules``; a later import of the package then lacks it as an attribute, and every rank forked from
    the warm parent failed (``module 'torch._dynamo' has no attribute 'utils'``, seen once in a DDP job).
    Such a warm parent is unsafe (mlaunch restarts it without the module); a module that fails before
    importing anything is only skipped, as before."""
    (tmp_path / "halfpkg").mkdir()
    (tmp_path / "halfpkg" / "__init__.py").write_text("from . import sub\nraise RuntimeError('boom')\n")
    (tmp_path / "halfpkg" / "sub.py").write_text("X = 1\n")
    (tmp_path / "failsfirst.py").write_text("raise ImportError('not here')\n")
    code = (
        f"import json, sys; sys.path.insert(0, {str(tmp_path)!r}); "
        "from launchers.standby.warm_parent import learn; "
        "print(json.dumps(learn(['halfpkg', 'failsfirst'])))"  # roots_first: failsfirst, then halfpkg
    )
    env = {**clean_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    assert reply["skipped"] == {"failsfirst": "ImportError: not here"}, reply
    assert reply["module"] == "halfpkg" and "halfpkg.sub" in reply["unsafe"] and "boom" in reply["unsafe"], reply


DDP_LEARN = """\
import os, sys, time
at_start = {"dynamo": "torch._dynamo" in sys.modules, "helper": "jobhelper" in sys.modules}
import torch
import torch.distributed as dist
from torch import nn
from launchers import elastic
import jobhelper  # the job's own module: never learned
dist.init_process_group("gloo")
rank, attempt = dist.get_rank(), os.environ["MLAUNCH_RESTART_COUNT"]
print(f"attempt {attempt} dynamo {at_start['dynamo']} helper {at_start['helper']}", flush=True)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)  # imports torch._dynamo
for step in range(100000):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    elastic.heartbeat(step)
    if attempt == "0" and rank == 1 and os.path.exists(os.environ["STOP_FILE"]):
        sys.exit(7)
    if attempt != "0" and step >= 3:
        break
    time.sleep(0.05)
dist.destroy_process_group()
"""


def learn_then_fail(job: Path, stop: Path) -> tuple[list[str], list[str]]:
    """Run mlaunch on ``job`` until it said what it learned and standbys are ready, then make rank 1 fail
    (``stop``) so that the group restarts from them; mlaunch's stderr and stdout lines."""
    proc = subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
        env=clean_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    err: list[str] = []
    out: list[str] = []
    readers = [
        threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True),
        threading.Thread(target=lambda: out.extend(proc.stdout or []), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        learned = lambda: any("preload: the ranks also import" in line for line in err)  # noqa: E731
        assert wait_for(lambda: learned() and any("warm standby workers ready" in x for x in err), 240), "".join(err)
        time.sleep(1.0)  # the idle standbys forked before the lesson are replaced within a loop pass
        stop.touch()
        assert proc.wait(timeout=240) == 0, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()  # the watchdog takes the ranks, standbys and warm parent with it
            proc.wait()
        for reader in readers:
            reader.join(timeout=30)
    return err, out


@pytest.mark.slow
@pytest.mark.skipif(not torch_available(), reason="needs torch")
def test_learning_adds_torch_dynamo_for_a_ddp_job_and_nothing_of_the_job(tmp_path: Path) -> None:
    """``preload: [torch, torch.distributed, launchers.elastic]`` lacks what the optimizer imports:
    mlaunch learns it from the ranks, says so once, and the restarted ranks start with it —
    but not with the job's own ``jobhelper``."""
    (tmp_path / "ddp_learn.py").write_text(DDP_LEARN)
    (tmp_path / "jobhelper.py").write_text("import os\nRANK = os.environ['RANK']\n")
    stop = tmp_path / "stop"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: ddp_learn.py\nprocs_per_node: 2\nlog_dir: {tmp_path}/logs\n"
        "preload: [torch, torch.distributed, launchers.elastic]\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\ncheckpoint: {{grace_period: 5s, dir: {tmp_path}/ckpt}}\n"
        f"env: {{GLOO_SOCKET_IFNAME: lo, STOP_FILE: '{stop}'}}\n"
    )
    err, out = learn_then_fail(job, stop)
    learned = [line for line in err if "preload: the ranks also import" in line]
    assert "torch._dynamo" in learned[0] and "jobhelper" not in "".join(err), learned
    assert sorted(line for line in out if "attempt 1" in line) == [
        "[rank 0] attempt 1 dynamo True helper False\n",
        "[rank 1] attempt 1 dynamo True helper False\n",
    ], "".join(out)


LAZY = """\
import os, sys, time
at_start = "decimal" in sys.modules
from launchers import elastic
attempt = os.environ["MLAUNCH_RESTART_COUNT"]
print(f"attempt {attempt} decimal {at_start}", flush=True)
for step in range(100000):
    import decimal  # noqa: F401 - a lazy import, like the optimizer's
    elastic.heartbeat(step)
    if attempt == "0" and os.environ["RANK"] == "1" and os.path.exists(os.environ["STOP_FILE"]):
        sys.exit(7)
    if attempt != "0" and step >= 3:
        break
    time.sleep(0.05)
"""


def test_with_restarts_and_no_list_the_warm_parent_learns_from_nothing(tmp_path: Path) -> None:
    """No ``preload:`` at all: the warm parent starts empty and preloads what the ranks import."""
    (tmp_path / "lazy.py").write_text(LAZY)
    stop = tmp_path / "stop"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: lazy.py\nprocs_per_node: 2\nlog_dir: {tmp_path}/logs\nenv: {{STOP_FILE: '{stop}'}}\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\ncheckpoint: {{grace_period: 5s, dir: {tmp_path}/ckpt}}\n"
    )
    err, out = learn_then_fail(job, stop)
    learned = [line for line in err if "preload: the ranks also import" in line]
    assert learned and "decimal" in learned[0], "".join(err)
    assert not any(name in "".join(learned) for name in ("sysconfig", "ctypes", "lazy")), learned  # mlaunch's own
    assert "restarting the group (1/1) in 0s from 2 warm standbys" in "".join(err)
    assert sorted(line for line in out if "attempt" in line) == [
        "[rank 0] attempt 0 decimal False\n",
        "[rank 0] attempt 1 decimal True\n",
        "[rank 1] attempt 0 decimal False\n",
        "[rank 1] attempt 1 decimal True\n",
    ], "".join(out)
