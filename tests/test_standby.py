"""Warm standby workers: processes that preloaded modules and become a worker on restart.

Real processes throughout: the pool starts standbys, the supervisor hands them a worker's
argv/env/cwd, and the tests look at what the running script sees (its pid, its argv, its env,
which modules were already imported) and at what is left when mlaunch is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, clean_env, mlaunch_cmd, run_mlaunch

from launchers.plan import ProcessSpec
from launchers.run.signal_router import SignalRouter
from launchers.run.supervisor import Output, Stopping, Supervisor
from launchers.standby.standby_pool import StandbyPool

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import alive, children, wait_for  # noqa: E402

REPORT = """\
import json, os, sys
print(json.dumps({
    "pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(), "answer": os.environ.get("ANSWER"),
    "preloaded": "decimal" in sys.modules, "name": __name__, "path0": sys.path[0],
    "stdin": sys.stdin.read(), "pgid": os.getpgid(0),
}), flush=True)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def script(tmp_path: Path) -> Path:
    path = tmp_path / "report.py"
    path.write_text(REPORT)
    return path


def spec(tmp_path: Path, rank: int = 0, **env: str) -> ProcessSpec:
    return ProcessSpec(
        rank, rank, [sys.executable, "-u", str(script(tmp_path)), "--flag", f"r{rank}"], dict(env), str(tmp_path)
    )


def warm_up(pool: StandbyPool, specs: list[ProcessSpec], timeout: float = 60) -> None:
    """Fill as the supervisor's loop does (the warm parent imports first, then forks) until every standby is ready."""

    def ready() -> bool:
        pool.maintain()
        pool.fill(specs, os.getpid())
        return pool.ready_count() == len(specs)

    assert wait_for(ready, timeout=timeout)


class Capture:
    def __init__(self) -> None:
        self.data = b""

    def write(self, chunk: bytes) -> int:
        self.data += chunk
        return len(chunk)

    def flush(self) -> None:
        pass


def test_a_standby_becomes_the_worker_it_is_handed(tmp_path: Path) -> None:
    import json

    pool = StandbyPool(["decimal"], run_id="standbytest", delay=0)
    try:
        specs = [spec(tmp_path, 0, ANSWER="42", EXIT="3")]
        warm_up(pool, specs)
        standby_pid = pool.standbys[0].pid
        out = Capture()
        with SignalRouter() as signals:
            outcome = Supervisor(
                specs, signals=signals, standbys=pool, stopping=Stopping(5), output=Output(out, Capture())
            ).run()
        assert outcome.status == "failed" and outcome.exit_code == 3  # the script's own exit code
        seen = json.loads(out.data.decode().split("] ", 1)[1])
        assert seen["pid"] == standby_pid and seen["pgid"] == standby_pid  # its own process group
        assert seen["argv"] == [str(tmp_path / "report.py"), "--flag", "r0"]
        assert seen["cwd"] == str(tmp_path) and seen["answer"] == "42" and seen["name"] == "__main__"
        assert seen["preloaded"] is True and seen["path0"] == str(tmp_path) and seen["stdin"] == ""
        assert pool.handed_off == 1
    finally:
        pool.close()


def test_a_standby_whose_preload_fails_is_not_used(tmp_path: Path) -> None:
    import json

    said: list[str] = []
    pool = StandbyPool(["no_such_module_anywhere"], delay=0, announce=said.append)
    try:
        specs = [spec(tmp_path)]
        assert wait_for(lambda: pool.fill(specs, os.getpid()) or not pool.fork, timeout=60)  # the warm parent failed
        assert "cannot import no_such_module_anywhere" in said[0], said
        assert wait_for(lambda: not pool._alive(), timeout=60)  # and so did the standby importing it itself
        out = Capture()
        with SignalRouter() as signals:
            outcome = Supervisor(
                specs, signals=signals, standbys=pool, stopping=Stopping(5), output=Output(out, Capture())
            ).run()
        assert outcome.status == "succeeded"
        seen = json.loads(out.data.decode().split("] ", 1)[1])
        assert seen["preloaded"] is False and pool.cold_starts == 1
    finally:
        pool.close()


def test_only_python_workers_are_handed_to_standbys(tmp_path: Path) -> None:
    shell = ProcessSpec(0, 0, ["bash", "-c", "exit 0"], {}, str(tmp_path))
    assert not StandbyPool.compatible(shell)
    assert not StandbyPool.compatible(ProcessSpec(0, 0, [sys.executable, str(script(tmp_path))], {}, str(tmp_path)))
    assert StandbyPool.compatible(spec(tmp_path))


def job_with_preload(tmp_path: Path, entry: Path, extra: str = "") -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: {entry}\nprocs_per_node: 2\nlog_dir: {tmp_path}/logs\npreload: [decimal]\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\ncheckpoint: {{grace_period: 5s, dir: {tmp_path}/ckpt}}\n{extra}"
    )
    return job


ATTEMPT = (
    "import os, sys, time\n"
    "attempt = os.environ['MLAUNCH_RESTART_COUNT']\n"
    "print('attempt', attempt, 'preloaded', 'decimal' in sys.modules, flush=True)\n"
)


def run_attempts(tmp_path: Path, then: str) -> subprocess.CompletedProcess[str]:
    """mlaunch runs a script that says, per attempt, whether ``preload: [decimal]`` was imported, then ``then``."""
    entry = tmp_path / "attempts.py"
    entry.write_text(ATTEMPT + then)
    result = run_mlaunch(["--engine", "pytorch", str(job_with_preload(tmp_path, entry))], timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def test_mlaunch_starts_and_restarts_from_warm_standbys(tmp_path: Path) -> None:
    """The warm parent starts with mlaunch: the first attempt's ranks are forked from it (their
    ``import`` already done), and so are the restarted ones."""
    result = run_attempts(
        tmp_path,
        "if attempt == '0':\n"
        "    time.sleep(4)  # long enough for the refill after the start\n"
        "    sys.exit(7 if os.environ['RANK'] == '1' else 0)\n",
    )
    assert "2 warm standby workers ready for a restart" in result.stderr
    assert "restarting the group (1/1) in 0s from 2 warm standbys" in result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if "attempt" in line)
    assert lines == [
        "[rank 0] attempt 0 preloaded True",
        "[rank 0] attempt 1 preloaded True",
        "[rank 1] attempt 0 preloaded True",
        "[rank 1] attempt 1 preloaded True",
    ]


def test_a_restart_before_the_first_step_is_warm_too(tmp_path: Path) -> None:
    """A rank that fails at once (before any step, before the pool's refill would start) is
    restarted from ranks forked then, not cold: the storm's second fault in a cold start cost a
    second cold start (issue 35)."""
    result = run_attempts(tmp_path, "sys.exit(7 if attempt == '0' and os.environ['RANK'] == '1' else 0)\n")
    lines = sorted(line for line in result.stdout.splitlines() if "attempt 1" in line)
    assert lines == ["[rank 0] attempt 1 preloaded True", "[rank 1] attempt 1 preloaded True"], result.stdout


def test_sigkill_of_mlaunch_takes_the_standbys_with_it(tmp_path: Path) -> None:
    entry = tmp_path / "forever.py"
    entry.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    proc = subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job_with_preload(tmp_path, entry))],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        end = time.monotonic() + 90
        while time.monotonic() < end:
            line = proc.stderr.readline()
            if "warm standby workers ready" in line or not line:
                break
        kids = [p for p in children(proc.pid)]
        # the warm parent and the 2 standbys it forked (mlaunch adopted them), the 2 workers forked from it, which
        # show their own command line (``launchers.standby.proc_title``), and the watchdog
        lines = {p: Path(f"/proc/{p}/cmdline").read_bytes() for p in kids}
        forked = [p for p, line in lines.items() if b"launchers.standby.warm_parent" in line]
        workers = [p for p, line in lines.items() if line.startswith(f"{sys.executable} -u {entry}".encode())]
        assert len(forked) == 3 and len(workers) == 2 and len(kids) >= 6, lines
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert wait_for(lambda: not any(alive(p) for p in kids), timeout=20), [p for p in kids if alive(p)]


STARTED = """\
import time
print(f"started {time.time():.6f}", flush=True)
"""


def test_store_to_wait_for_only_for_ranks_other_than_0() -> None:
    from launchers.standby.standby_pool import store_to_wait_for

    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert store_to_wait_for({**env, "RANK": "3"}) == ("10.0.0.1", 29500)
    assert store_to_wait_for({**env, "RANK": "0"}) is None  # rank 0 hosts the store
    assert store_to_wait_for({"RANK": "3"}) is None  # not a torch.distributed env
    assert store_to_wait_for({**env, "MASTER_PORT": "", "RANK": "1"}) is None


def test_a_warm_rank_other_than_0_waits_for_the_store_to_listen(tmp_path: Path) -> None:
    """A torch TCPStore client refused once retries only ~0.7 s later: the warm rank 1 must not
    start its script before rank 0's store (here a plain socket that listens 0.4 s late) accepts."""
    import socket
    import threading

    (tmp_path / "started.py").write_text(STARTED)
    store = socket.socket()
    store.bind(("127.0.0.1", 0))  # reserved, not listening: connections are refused
    port = store.getsockname()[1]
    argv = [sys.executable, "-u", str(tmp_path / "started.py")]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1"}
    specs = [ProcessSpec(1, 1, argv, env, str(tmp_path))]
    pool = StandbyPool(["decimal"], run_id="standbywait", delay=0)
    listening_at: list[float] = []

    def listen_late() -> None:
        time.sleep(0.4)
        listening_at.append(time.time())
        store.listen()

    try:
        warm_up(pool, specs)
        out = Capture()
        late = threading.Thread(target=listen_late, daemon=True)
        late.start()
        with SignalRouter() as signals:
            outcome = Supervisor(
                specs, signals=signals, standbys=pool, stopping=Stopping(5), output=Output(out, Capture())
            ).run()
        assert outcome.status == "succeeded" and pool.handed_off == 1
        started = float(out.data.decode().split("started ", 1)[1].split()[0])
        assert listening_at and started >= listening_at[0]
        late.join()
    finally:
        pool.close()
        store.close()
