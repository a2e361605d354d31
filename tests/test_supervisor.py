"""Supervision with real processes and real signals (no torch: tests/scripts/behave.py).

Each test writes a job.yaml whose entry is behave.py, tells each rank what to do through
env, runs the real `mlaunch` command and checks what a user relies on: exit codes, teardown,
signal forwarding, restarts, logs, and that no process outlives mlaunch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, run_mlaunch

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import alive  # noqa: E402  (True when a pid exists and is not a zombie)

BEHAVE = ROOT / "tests" / "scripts" / "behave.py"


def write_job(tmp_path: Path, *, nodes: int = 1, procs: int = 2, grace: str = "5s", extra: str = "") -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: {BEHAVE}\nengine: pytorch\nnodes: {nodes}\nprocs_per_node: {procs}\n"
        f"log_dir: {tmp_path / 'logs'}\ncheckpoint: {{grace_period: {grace}}}\n{extra}"
    )
    return job


def read_pids(pid_dir: Path) -> list[int]:
    pids = []
    for f in pid_dir.glob("*.pids"):
        pids += [int(x) for x in f.read_text().split()]
    return pids


def wait_for(predicate, timeout: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_success_streams_prefixed_output_and_writes_logs(tmp_path: Path) -> None:
    job = write_job(tmp_path, extra="")
    env = clean_env(BEHAVE="print:hello,stderr:oops,exit:0")
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "[rank 0] hello" in result.stdout and "[rank 1] hello" in result.stdout
    assert "[rank 0] oops" in result.stderr
    assert (tmp_path / "logs" / "rank0.log").read_text().splitlines() == ["hello", "oops"]
    assert (tmp_path / "logs" / "rank1.log").exists()


def test_several_simulated_nodes_prefix_node_and_rank(tmp_path: Path) -> None:
    job = write_job(tmp_path, nodes=2, procs=1)
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=clean_env(BEHAVE="print:hi"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "[node 0 rank 0] hi" in result.stdout
    assert "[node 1 rank 1] hi" in result.stdout


def test_rank_exit_code_is_mlaunch_exit_code_and_others_are_torn_down(tmp_path: Path) -> None:
    job = write_job(tmp_path, procs=3)
    marks = tmp_path / "marks"
    env = clean_env(BEHAVE="forever", BEHAVE_2="print:about to fail,sleep:0.5,exit:3", BEHAVE_MARKS=str(marks))
    start = time.monotonic()
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=env, timeout=60)
    assert result.returncode == 3
    assert time.monotonic() - start < 30
    assert "rank 2" in result.stderr and "exited with code 3" in result.stderr
    assert "about to fail" in result.stderr  # the summary shows the failing rank's last lines
    assert sorted(marks.read_text().split("\n")[:-1]) == ["TERM 0", "TERM 1"]
    assert "Traceback" not in result.stderr


def test_kill_minus_nine_of_a_rank_is_reported_with_its_code(tmp_path: Path) -> None:
    job = write_job(tmp_path, procs=2)
    env = clean_env(BEHAVE="forever", BEHAVE_1="sleep:0.5,kill9")
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=env, timeout=60)
    assert result.returncode == 137
    assert "rank 1" in result.stderr and "SIGKILL" in result.stderr


def test_restart_after_failure_then_success(tmp_path: Path) -> None:
    job = write_job(tmp_path, procs=2, extra="restart: {max_restarts: 1, backoff: 0.1s}\n")
    env = clean_env(BEHAVE="sleep:0.2,exit:0", BEHAVE_1="fail_first:5,print:second attempt")
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "restarting the group (1/1)" in result.stderr
    assert "[rank 1] second attempt" in result.stdout
    log = (tmp_path / "logs" / "rank1.log").read_text()
    assert "second attempt" in log  # logs are appended across attempts


def test_restarts_exhausted_exits_with_last_failure(tmp_path: Path) -> None:
    job = write_job(tmp_path, procs=1, extra="restart: {max_restarts: 2, backoff: 0.05s}\n")
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=clean_env(BEHAVE="exit:4"), timeout=60)
    assert result.returncode == 4
    assert result.stderr.count("job failed: rank 0") == 3
    assert "giving up after 2 restart(s)" in result.stderr


def test_workers_see_restart_count(tmp_path: Path) -> None:
    script = tmp_path / "count.py"
    script.write_text(
        "import os,sys\nc=os.environ['MLAUNCH_RESTART_COUNT']\nassert c==os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "print('attempt', c)\nsys.exit(0 if c=='2' else 1)\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(f"entry: {script}\nrestart: {{max_restarts: 3, backoff: 0.01s}}\nlog_dir: {tmp_path}/logs\n")
    result = run_mlaunch(["--engine", "pytorch", str(job)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if "attempt" in line] == [
        "[rank 0] attempt 0",
        "[rank 0] attempt 1",
        "[rank 0] attempt 2",
    ]


def _start(job: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_sigterm_is_forwarded_and_mlaunch_exits_143_within_grace(tmp_path: Path) -> None:
    job = write_job(tmp_path, procs=2, grace="10s")
    marks, pids = tmp_path / "marks", tmp_path / "pids"
    pids.mkdir()
    env = clean_env(BEHAVE="forever", BEHAVE_MARKS=str(marks), BEHAVE_PIDS=str(pids))
    proc = _start(job, env)
    assert wait_for(lambda: len(read_pids(pids)) == 2)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - start
    assert proc.returncode == 143, err
    assert elapsed < 10
    assert sorted(marks.read_text().split("\n")[:-1]) == ["TERM 0", "TERM 1"]
    assert "received SIGTERM" in err
    assert not any(alive(p) for p in read_pids(pids))


def test_grace_period_ends_with_sigkill_for_workers_ignoring_sigterm(tmp_path: Path) -> None:
    job = write_job(tmp_path, procs=2, grace="1s")
    pids = tmp_path / "pids"
    pids.mkdir()
    env = clean_env(BEHAVE="ignore_term,forever", BEHAVE_PIDS=str(pids))
    proc = _start(job, env)
    assert wait_for(lambda: len(read_pids(pids)) == 2)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert 0.9 < time.monotonic() - start < 10
    assert "grace period of 1s is over" in err
    assert not any(alive(p) for p in read_pids(pids))


def test_sigkill_of_mlaunch_leaves_no_process_alive(tmp_path: Path) -> None:
    """Parent-death signal for workers; the watchdog for grandchildren, even ones that called setsid()."""
    job = write_job(tmp_path, nodes=2, procs=2)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = clean_env(BEHAVE="grandchild,escapee,forever", BEHAVE_PIDS=str(pids))
    proc = _start(job, env)
    assert wait_for(lambda: len(read_pids(pids)) == 12)  # 4 workers × (self + 2 grandchildren)
    proc.kill()
    proc.wait(timeout=10)
    time.sleep(2)
    survivors = [p for p in read_pids(pids) if alive(p)]
    assert survivors == []


def test_background_grandchild_is_cleaned_up_after_success(tmp_path: Path) -> None:
    job = write_job(tmp_path, procs=1)
    pids = tmp_path / "pids"
    pids.mkdir()
    result = run_mlaunch(
        ["--engine", "pytorch", str(job)], env=clean_env(BEHAVE="grandchild,escapee,exit:0", BEHAVE_PIDS=str(pids))
    )
    assert result.returncode == 0, result.stderr
    time.sleep(0.5)
    assert [p for p in read_pids(pids) if alive(p)] == []


def test_services_are_stopped_when_required_processes_finish() -> None:
    """A service (TF parameter server style) never exits by itself; success is decided by the workers."""
    from launchers.plan import ProcessSpec
    from launchers.run.signal_router import SignalRouter
    from launchers.run.supervisor import Stopping, Supervisor

    python = os.environ.get("PYTHON", "python3")
    procs = [
        ProcessSpec(0, 0, [python, "-c", "import time; time.sleep(0.3)"], {}, str(ROOT)),
        ProcessSpec(0, 0, [python, "-c", "import time; time.sleep(600)"], {}, str(ROOT), role="ps", required=False),
    ]
    with SignalRouter() as signals:
        start = time.monotonic()
        outcome = Supervisor(procs, signals=signals, stopping=Stopping(5)).run()
    assert outcome.status == "succeeded" and outcome.exit_code == 0
    assert time.monotonic() - start < 5


def _attempt_regrouped_after(first_exit: str | None, second: str, tmp_path: Path) -> str:
    """One attempt of two real processes; node 0's regroup comes once the first has exited.

    ``first_exit`` None: the first one does not exit (the regroup comes as it started), and
    leaves with 0 when stopped.

    The regroup is handed in as the control plane hands it to the supervisor (``JobEvents.poll``);
    the plane itself, with real sockets, is tests/test_membership_plane.py.
    """
    from launchers.control import LocalEvents, Regroup
    from launchers.plan import ProcessSpec
    from launchers.run.signal_router import SignalRouter
    from launchers.run.supervisor import Stopping, Supervisor, Watchers

    marker = tmp_path / "first-exited"

    class RegroupOnceTheFirstExited(LocalEvents):
        said = False

        def poll(self):  # type: ignore[no-untyped-def]
            if self.said or not marker.exists() or time.time() - marker.stat().st_mtime < 0.5:
                return None  # the regroup comes half a second after the first process ended
            self.said = True
            return Regroup("node 2 waits to join")

    python = os.environ.get("PYTHON", "python3")
    on_term = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit({code}))\n"
    first = f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n"
    first += f"raise SystemExit({first_exit})" if first_exit else on_term.format(code=0) + "time.sleep(60)"
    procs = [
        ProcessSpec(0, 0, [python, "-c", first], {}, str(ROOT)),
        ProcessSpec(1, 1, [python, "-c", on_term.format(code=second) + "time.sleep(60)"], {}, str(ROOT)),
    ]
    with SignalRouter() as signals:
        watchers = Watchers(job_events=RegroupOnceTheFirstExited())
        return Supervisor(procs, signals=signals, stopping=Stopping(10), watchers=watchers).run().status


def test_ranks_that_finish_training_as_node_0_regroups_end_the_job_instead_of_re_forming(tmp_path: Path) -> None:
    """The 300-fault storm's last fault: node 0 regrouped for a waiting node as the job's last step
    ended. A rank that exits 0 before any stop finished the training (a rank stopped for a re-form
    leaves with 143): with every rank ending well, the attempt succeeded; re-forming would train
    the last steps again, or wait for members that already finished."""
    assert _attempt_regrouped_after("0", "0", tmp_path) == "succeeded"
    assert _attempt_regrouped_after("0", "143", tmp_path) == "reformed"  # a rank still training stopped for it
    assert _attempt_regrouped_after(None, "0", tmp_path) == "reformed"  # both ended 0 only when stopped


def _attempt_after_a_node_left(tmp_path: Path, own_handler: bool) -> tuple[str, list[int | None], list[str]]:
    """One attempt of two real ranks past their first step, blocked (as in a collective with the
    ranks of a node that is gone); then the control plane says a node left, not gracefully.

    Ranks with ``elastic.install()`` are guarded: their SIGTERM only asks them to save at an
    agreed step. ``own_handler``: rank 1 has its own SIGTERM handler instead (exits 143 by it).
    """
    import secrets

    from launchers.control import Left, LocalEvents
    from launchers.plan import ProcessSpec
    from launchers.run.signal_router import SignalRouter
    from launchers.run.supervisor import Output, Stopping, Supervisor, Watchers

    ready = [tmp_path / "ready-0", tmp_path / "ready-1"]

    class NodeLeftOnceBothStepped(LocalEvents):
        said = False

        def poll(self):  # type: ignore[no-untyped-def]
            if self.said or not all(p.exists() for p in ready):
                return None
            self.said = True
            return Left(2, "host-2", "its mlaunch sent nothing for 3.1s")

    python = sys.executable
    guarded = (
        "import pathlib, sys, time\nsys.path.insert(0, {root!r})\nfrom launchers import elastic\n"
        "guard = elastic.install(quiet=True)\nguard.should_stop(0)\n"
        "pathlib.Path({ready!r}).touch()\ntime.sleep(60)\n"
    )
    handler = (
        "import pathlib, signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
        "pathlib.Path({ready!r}).touch()\ntime.sleep(60)\n"
    )
    code = [guarded.format(root=str(ROOT), ready=str(ready[0]))]
    code.append((handler if own_handler else guarded).format(root=str(ROOT), ready=str(ready[1])))
    procs = [ProcessSpec(r, r, [python, "-c", c], {}, str(ROOT)) for r, c in enumerate(code)]
    said: list[str] = []
    with SignalRouter() as signals:
        supervisor = Supervisor(
            procs,
            run_id=secrets.token_hex(8),
            signals=signals,
            stopping=Stopping(10),
            watchers=Watchers(job_events=NodeLeftOnceBothStepped()),
            output=Output(announce=said.append),
        )
        status = supervisor.run().status
    return status, [w.returncode for w in supervisor.workers], said


def test_ranks_that_can_save_nothing_after_a_node_left_are_killed_at_once(tmp_path: Path) -> None:
    """After a node left mid-step the ranks here can neither finish a collective nor agree a stop
    step with its ranks: a guarded rank's SIGTERM would only sit out the second before SIGKILL,
    and the storm of issue 35 paid that second at every such re-form. Guarded ranks are SIGKILLed
    at once; a rank with its own SIGTERM handler still gets SIGTERM and its second."""
    status, codes, said = _attempt_after_a_node_left(tmp_path, own_handler=False)
    assert status == "reformed" and codes == [128 + signal.SIGKILL] * 2, (codes, said)
    assert any("can save nothing without that node's ranks" in line for line in said), said
    assert not any("grace period are over" in line for line in said), said

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    status, codes, said = _attempt_after_a_node_left(mixed, own_handler=True)
    assert status == "reformed" and codes[1] == 143, (codes, said)  # its own handler ran
    assert not any("can save nothing" in line for line in said), said


def test_missing_interpreter_fails_cleanly(tmp_path: Path) -> None:
    """A missing interpreter is a user error found before anything starts (exit 2, not 127)."""
    job = tmp_path / "job.yaml"
    job.write_text(f"entry: {BEHAVE}\npython: /nonexistent/python\nprocs_per_node: 2\n")
    result = run_mlaunch(["--engine", "pytorch", str(job)], timeout=60)
    assert result.returncode == 2
    assert "nothing was launched" in result.stderr and "/nonexistent/python does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_usr1_is_forwarded_without_stopping(tmp_path: Path) -> None:
    script = tmp_path / "usr1.py"
    ready = tmp_path / "ready"
    script.write_text(
        "import signal,sys,time,pathlib\n"
        "signal.signal(signal.SIGUSR1, lambda *a: (print('got usr1', flush=True), sys.exit(0)))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)\nsys.exit(1)\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(f"entry: {script}\nlog_dir: {tmp_path}/logs\n")
    proc = _start(job, clean_env())
    assert wait_for(ready.exists)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "[rank 0] got usr1" in out


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_sighup_also_stops_with_128_plus_signal(tmp_path: Path, sig: int) -> None:
    job = write_job(tmp_path, procs=1, grace="5s")
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _start(job, clean_env(BEHAVE="forever", BEHAVE_PIDS=str(pids)))
    assert wait_for(lambda: len(read_pids(pids)) == 1)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
