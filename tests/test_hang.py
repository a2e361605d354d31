"""Hang detection (``monitor.hang_timeout``) and the stop after a peer's failure (``restart.stop_timeout``).

Real processes through real ``mlaunch``: plain Python ranks that report progress with
``elastic.heartbeat`` and then sleep (a hang in C code: ``time.sleep``), and the deterministic
2 × 2 DDP chaos training (gloo, CPU) where one rank sleeps forever inside a step while its peers
block in the step's all-reduce: detected within hang_timeout + 2 s, the hung rank's log holds its
Python stack at the sleeping line, the job restarts and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch

from launchers.elastic.ipc import progress

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import CHAOS, final_checksum  # noqa: E402


class Run:
    """mlaunch in the background; every output line kept with the time it arrived."""

    def __init__(self, job: Path, **env: str) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
            env=clean_env(**env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: list[tuple[float, str]] = []
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def finish(self, timeout: float = 240) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # mlaunch's watchdog takes its ranks along: nothing left running for the next test
            self.proc.wait(10)
            raise
        time.sleep(0.2)
        return code

    def first(self, pattern: str) -> tuple[float, re.Match[str]] | None:
        for at, line in list(self.lines):
            if m := re.search(pattern, line):
                return at, m
        return None

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def plain_job(tmp: Path, script: str, *, extra: str = "", nodes: int = 1, procs: int = 2) -> Path:
    (tmp / "rank.py").write_text(textwrap.dedent(script))
    job = tmp / "job.yaml"
    job.write_text(
        f"name: hang\nengine: pytorch\nentry: rank.py\nnodes: {nodes}\nprocs_per_node: {procs}\n"
        f"log_dir: {tmp / 'logs'}\n{extra}"
    )
    return job


HEARTBEAT_THEN_SLEEP = """
    import os, time
    from launchers import elastic
    rank = int(os.environ["RANK"])
    for step in range(5):
        elastic.heartbeat(step)
        time.sleep(0.1)
    print(f"rank {rank} done stepping", flush=True)
    if rank == 1:
        time.sleep(3600)  # HUNG HERE
    else:
        for step in range(5, 10_000):
            elastic.heartbeat(step)
            time.sleep(0.1)
"""


def test_heartbeat_is_cheap_and_written_where_mlaunch_reads_it(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import time
        from launchers import elastic
        from launchers.elastic.ipc import progress
        elastic.heartbeat(0)
        n = 100_000
        t = time.perf_counter()
        for i in range(n):
            progress.report(i)
        print((time.perf_counter() - t) / n * 1e6)
        """
    )
    env = clean_env(MLAUNCH_RUN_ID="hb1", MLAUNCH_SHM_DIR=str(tmp_path), RANK="3", MLAUNCH_RESTART_COUNT="2")
    out = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True, check=True)
    per_call_us = float(out.stdout.strip())
    assert per_call_us < 20, per_call_us  # about 1 µs on a desktop; generous for a loaded CI machine
    os.environ["MLAUNCH_SHM_DIR"] = str(tmp_path)
    try:
        (report,) = progress.read_run("hb1")
        assert (report.rank, report.attempt, report.step, report.count) == (3, 2, 99_999, 100_001)
        assert report.stack_signal == int(progress.STACK_SIGNAL)
        assert progress.unlink_run("hb1") == 1
    finally:
        del os.environ["MLAUNCH_SHM_DIR"]


def test_hung_rank_detected_its_stack_logged_and_failure_names_it(tmp_path: Path) -> None:
    job = plain_job(
        tmp_path, HEARTBEAT_THEN_SLEEP, extra="monitor: {hang_timeout: 2s}\ncheckpoint: {grace_period: 30s}\n"
    )
    run = Run(job)
    code = run.finish(60)
    assert code == 137, run.text
    done = run.first(r"\[rank 1\] rank 1 done stepping")
    hung = run.first(r"rank 1 \(pid \d+\) hung: no progress for 2s .*last step (\d+)")
    assert done and hung, run.text
    assert hung[1].group(1) == "4"
    latency = hung[0] - done[0]
    assert latency <= 2 + 2, latency
    log = (tmp_path / "logs" / "rank1.log").read_text()
    line = next(i for i, text in enumerate(HEARTBEAT_THEN_SLEEP.splitlines(), 1) if "HUNG HERE" in text)
    assert re.search(rf'File ".*rank\.py", line {line} in <module>', log), log  # the sleeping line
    assert "thread 0x" in (tmp_path / "logs" / "rank0.log").read_text().lower()  # every rank of the node dumped
    assert "job failed: rank 1" in run.text
    # stopped right away: the other rank never got to use its 30s grace period
    assert run.finish() == 137 and time.monotonic() - run.started < 20


def test_ranks_that_never_report_are_not_judged(tmp_path: Path) -> None:
    job = plain_job(tmp_path, "import time\ntime.sleep(2.5)\n", extra="monitor: {hang_timeout: 1s}\n")
    result = run_mlaunch([str(job)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "hung" not in result.stderr


FINISHED_THEN_SLOW_EXIT = """
    import time
    from launchers import elastic
    for step in range(5):
        elastic.heartbeat(step)
        time.sleep(0.05)
    elastic.finished()
    time.sleep(3)  # a finished rank's teardown: the last garbage collections of a large program take seconds
"""


def test_a_finished_rank_slow_to_exit_is_not_judged_hung(tmp_path: Path) -> None:
    """A rank that reported completion and then takes longer than its hang limit to exit (a program that imported
    transformers and DeepSpeed spent 8-12 s in the interpreter's last collections) is tearing down, not hung:
    the job ends 0. It used to be failed as hung, every rank SIGKILLed after the training had finished."""
    job = plain_job(tmp_path, FINISHED_THEN_SLOW_EXIT, extra="monitor: {hang_timeout: 1s}\n")
    result = run_mlaunch([str(job)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "hung" not in result.stderr


PEER_CRASHES = """
    open(os.path.join(os.environ["READY_DIR"], str(rank)), "w").close()
    while len(os.listdir(os.environ["READY_DIR"])) < 4:  # all four ranks are up
        time.sleep(0.01)
    if rank == 3:
        time.sleep(0.3)
        os._exit(5)  # the peer's crash
"""

SURVIVOR = (
    """
    import os, signal, sys, time
    rank = int(os.environ["RANK"])
    def on_term(signum, frame):
        print(f"term {rank} {time.time():.6f}", flush=True)
        while True:  # like a trainer's handler waiting in a collective with the dead peer
            time.sleep(1)
    signal.signal(signal.SIGTERM, on_term)
"""
    + PEER_CRASHES
    + """
    while True:
        time.sleep(1)
"""
)


def test_survivors_of_a_crash_do_not_hold_the_restart_for_the_grace_period(tmp_path: Path) -> None:
    (tmp_path / "ready").mkdir()
    job = plain_job(
        tmp_path,
        SURVIVOR,
        nodes=2,
        procs=2,
        extra="checkpoint: {grace_period: 60s}\nrestart: {stop_timeout: 1s}\n",
    )
    run = Run(job, READY_DIR=str(tmp_path / "ready"))
    code = run.finish(50)
    assert code == 5, run.text
    crash = run.first(r"rank 3 \(pid \d+\) exited with code 5")
    assert crash, run.text
    terms = [float(m.group(1)) for _, line in run.lines if (m := re.search(r"\] term \d (\d+\.\d+)$", line))]
    assert len(terms) == 3, run.text
    spread = max(terms) - min(terms)
    print(f"SIGTERM spread across the 3 survivors: {spread * 1000:.2f} ms")
    assert spread < 0.05, spread
    assert "stop timeout of 1s after the failure is over (restart.stop_timeout)" in run.text
    ended = max(at for at, _ in run.lines)
    assert ended - crash[0] < 5, ended - crash[0]  # 1s, not the 60s grace period


GUARDED_SURVIVOR = (
    """
    import os, sys, time
    from launchers import elastic
    rank = int(os.environ["RANK"])
    elastic.install()  # the guard: a SIGTERM only sets the flag, the save waits for a step boundary
    if os.environ["STEPPED"] == "1":
        elastic.heartbeat(0)  # this rank has reached a step boundary: it may have something to save
"""
    + PEER_CRASHES
    + """
    while True:  # still starting up (imports, a cold DDP), or stepping: the flag is read at the next boundary
        time.sleep(1)
"""
)


@pytest.mark.parametrize("stepped", [False, True], ids=["before-the-first-step", "after-a-step"])
def test_survivors_that_have_not_reached_a_step_are_killed_at_once_after_a_crash(tmp_path: Path, stepped: bool) -> None:
    """Guarded ranks save only at an agreed step boundary, which the crashed rank can no longer join.

    Before their first boundary what they would save is the state they started from, so they are
    SIGKILLed at once instead of holding the restart for ``restart.stop_timeout`` (in a chaos storm,
    faults landing in a restart's start-up cost 3 s each). A rank that has reported a step keeps
    its stop timeout.
    """
    (tmp_path / "ready").mkdir()
    timeout = 2 if stepped else 120  # before the fix the first case held the restart for 120 s
    job = plain_job(
        tmp_path,
        GUARDED_SURVIVOR,
        nodes=2,
        procs=2,
        extra=f"checkpoint: {{grace_period: 180s}}\nrestart: {{stop_timeout: {timeout}s}}\n",
    )
    run = Run(job, READY_DIR=str(tmp_path / "ready"), STEPPED="1" if stepped else "0")
    code = run.finish(90)
    assert code == 5, run.text
    said = "no rank here has reached a step boundary in this attempt"
    held = f"stop timeout of {timeout}s after the failure is over (restart.stop_timeout)"
    if stepped:
        assert said not in run.text and held in run.text, run.text
    else:
        assert said in run.text and held not in run.text, run.text
        assert "SIGKILL to node 0 rank 0, node 0 rank 1, node 1 rank 2" in run.text, run.text


STAGED_THEN_COMMITTED = """
    import os, time
    import numpy as np
    from launchers import elastic
    from launchers.elastic.format import layout
    from pathlib import Path
    rank, sync = int(os.environ["RANK"]), Path(os.environ["SYNC"])
    elastic.install()
    ckpt = elastic.Checkpointer(os.environ["CKPT"])
    for step in range(100):  # lock-step through files: every rank stages a step before any stages the next
        ckpt.stage(step, {"w": np.full(4, float(step)), "step": step})
        (sync / f"{rank}.{step}").touch()
        while len(list(sync.glob(f"*.{step}"))) < 4:
            time.sleep(0.01)
        if rank == 0:  # one decision for all: stop once mlaunch's background persist committed this step
            deadline = time.monotonic() + 3
            while layout.newest_step(Path(os.environ["CKPT"])) != step and time.monotonic() < deadline:
                time.sleep(0.02)
            done = layout.newest_step(Path(os.environ["CKPT"])) == step
            (sync / f"decided.{step}.{int(done)}").touch()
        while not (decided := list(sync.glob(f"decided.{step}.*"))):
            time.sleep(0.01)
        if decided[0].name.endswith(".1"):
            break
    if rank == 3:
        os._exit(5)  # the peer's crash, once the newest step every rank staged is committed
    while True:
        time.sleep(1)
"""


def test_survivors_are_killed_at_once_when_the_newest_staged_step_is_already_committed(tmp_path: Path) -> None:
    """The flash save after a crash finds nothing newer than the background persist's commit (``skipped``).

    The survivors cannot get past the crashed rank's step, so they have nothing newer to save:
    SIGKILL at once, as after a flash save that committed, not ``restart.stop_timeout``.
    """
    pytest.importorskip("numpy")
    job = plain_job(
        tmp_path,
        STAGED_THEN_COMMITTED,
        nodes=2,
        procs=2,
        extra=f"checkpoint: {{dir: {tmp_path / 'ckpt'}, grace_period: 180s, persist_every: 1}}\n"
        "restart: {stop_timeout: 120s}\n",
    )
    (tmp_path / "sync").mkdir()
    run = Run(job, CKPT=str(tmp_path / "ckpt"), SYNC=str(tmp_path / "sync"))
    code = run.finish(90)
    assert code == 5, run.text
    assert re.search(r"step \d+, the newest every rank staged, was already committed; SIGKILL to", run.text), run.text
    assert "restart.stop_timeout" not in run.text, run.text


STARTING_UP = """
    import os, sys, time
    from launchers import elastic
    rank = int(os.environ["RANK"])
    guard = elastic.install()
    open(os.path.join(os.environ["READY_DIR"], str(rank)), "w").close()
    while not guard.requested:  # start-up: imports, init_process_group waiting for its peers
        time.sleep(0.05)
    if os.environ["REACHES_A_STEP"] == "1":
        time.sleep(0.5)
        guard.should_stop(0)  # the first step boundary: the agreed stop, then the dying checkpoint
        time.sleep(2.0)  # writing it, past the start-up stop's second
        guard.exit()
    while True:  # stuck: a peer that already left never comes to init_process_group
        time.sleep(1)
"""


@pytest.mark.parametrize("reaches", [False, True], ids=["stuck-in-start-up", "reaches-a-step-and-saves"])
def test_a_stop_before_the_first_step_does_not_wait_out_the_grace_period(tmp_path: Path, reaches: bool) -> None:
    """SIGTERM to mlaunch while its guarded ranks start up: they get a second, not the grace period.

    Ranks that never reach a step boundary have nothing newer than where they started to save
    (in the chaos storm, a preemption in a restart's start-up held it for the whole 10 s grace
    period). A rank that reaches one within that second keeps the grace period for its save.
    """
    (tmp_path / "ready").mkdir()
    job = plain_job(tmp_path, STARTING_UP, nodes=1, procs=2, extra="checkpoint: {grace_period: 120s}\n")
    run = Run(job, READY_DIR=str(tmp_path / "ready"), REACHES_A_STEP="1" if reaches else "0")
    while len(os.listdir(tmp_path / "ready")) < 2 and run.proc.poll() is None:
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGTERM)
    code = run.finish(60)  # before the fix: the 120 s grace period
    assert code == 143, run.text
    assert "SIGKILL in 1s: no rank here has reached a step boundary yet (the grace period of 120s" in run.text
    said = "no rank here has reached a step boundary 1s into the stop"
    if reaches:
        assert said not in run.text and "SIGKILL to" not in run.text, run.text
    else:
        assert f"{said} (nothing newer than where they started to save); SIGKILL to rank 0, rank 1" in run.text


HUNG_BEFORE_THE_FIRST_STEP = """
    import os, time
    from launchers import elastic
    rank = int(os.environ["RANK"])
    elastic.install()  # uses launchers.elastic: its progress file exists, no report yet
    print(f"rank {rank} loaded its checkpoint", flush=True)
    time.sleep(3600)  # rank 1 HUNG HERE; rank 0 waits for it in the first step's collective
"""


def test_a_rank_hung_before_its_first_step_is_judged_after_the_start_timeout(tmp_path: Path) -> None:
    """A rank that hangs before its first progress report (a chaos storm: right after loading its checkpoint).

    ``hang_timeout`` judges only ranks that reported; before, such a job sat until something else
    happened (44 s in the storm; forever without another fault). ``monitor.start_timeout`` judges
    it like a hang: stacks, then a failure with the hang's exit code, naming the start timeout.
    """
    job = plain_job(tmp_path, HUNG_BEFORE_THE_FIRST_STEP, extra="monitor: {hang_timeout: 60s, start_timeout: 2s}\n")
    run = Run(job)
    code = run.finish(45)  # before: no judgement at all, the test's timeout
    assert code == 137, run.text
    assert "hung before its first step: no progress report 2s after the attempt started (monitor.start_timeout)" in (
        run.text
    ), run.text
    assert "outside any collective wait, innermost frame rank.py:" in run.text, run.text  # its stacks were dumped


def test_the_start_timeout_defaults_to_30_minutes_unless_hang_timeout_is_off(tmp_path: Path) -> None:
    from launchers.config.loader import load_job

    for extra, expected in (
        ("", 1800.0),  # hang_timeout: auto is the default
        ("monitor: {hang_timeout: 60s}\n", 1800.0),
        ("monitor: {hang_timeout: off}\n", None),
        ("monitor: {hang_timeout: off, start_timeout: 5m}\n", 300.0),
    ):
        job = load_job(plain_job(tmp_path, "print(1)\n", extra=extra))
        assert job.monitor.first_report_within() == expected, extra


# -- the DDP chaos training ---------------------------------------------------------------

STEPS = 16


def chaos_job(tmp: Path, *, extra: str = "") -> Path:
    job = tmp / "job.yaml"
    job.write_text(
        f"name: chaos\nengine: pytorch\nentry: {CHAOS}\nargs: ['--steps', '{STEPS}', '--save-every', '4']\n"
        f"nodes: 2\nprocs_per_node: 2\nenv: {{GLOO_SOCKET_IFNAME: lo}}\nlog_dir: {tmp / 'logs'}\n"
        f"checkpoint: {{dir: {tmp / 'ckpt'}, grace_period: 30s, keep: 10}}\n{extra}"
    )
    return job


@needs_torch
def test_ddp_rank_sleeping_in_a_step_is_detected_and_the_restart_resumes_bit_identical(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    ref.mkdir()
    reference = run_mlaunch(["--engine", "pytorch", str(chaos_job(ref))], timeout=300)
    assert reference.returncode == 0, reference.stderr
    state = tmp_path / "state"
    state.mkdir()
    job = chaos_job(tmp_path, extra="monitor: {hang_timeout: 3s}\nrestart: {max_restarts: 1, backoff: 0s}\n")
    run = Run(job, CHAOS_PLAN="3:7:hang", CHAOS_STATE=str(state))
    code = run.finish(300)
    assert code == 0, run.text
    fired = run.first(r"chaos fired 0 hang rank 3 step (\d+)")
    hung = run.first(r"hung: no progress for 3s \(monitor.hang_timeout\) on host \S+, last step (\d+)")
    assert fired and hung, run.text
    latency = hung[0] - fired[0]
    print(f"hang detected {latency:.2f}s after the rank started sleeping (hang_timeout 3s)")
    assert latency <= 3 + 2, latency
    # rank 3's log holds its Python stack at the sleeping line of chaos_train.py
    sleep_line = next(i for i, t in enumerate(CHAOS.read_text().splitlines(), 1) if "time.sleep(1)" in t)
    log = (tmp_path / "logs" / "rank3.log").read_text()
    assert re.search(rf'File ".*chaos_train\.py", line {sleep_line} in on_forward', log), log[-3000:]
    for rank in (0, 1, 2):  # its peers, blocked in the all-reduce, dumped too
        assert "thread 0x" in (tmp_path / "logs" / f"rank{rank}.log").read_text().lower()
    # Peers blocked in the collective stop reporting at the same step as the sleeping rank, so the
    # rank named first may be any of them; the stacks above show which one sleeps.
    assert re.search(r"flash save after node \d rank \d failed: committed step \d+", run.text), run.text
    assert "restarting the group (1/1)" in run.text
    assert final_checksum(run.text) == final_checksum(reference.stdout)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


HUNG_THEN_STOPPED = """
    import os, time
    from launchers import elastic
    rank = int(os.environ["RANK"])
    guard = elastic.install()  # SIGTERM only asks for a save at the agreed step
    for step in range(5):
        guard.should_stop(step)  # a boundary: progress reported
        time.sleep(0.1)
    print(f"rank {rank} stepped", flush=True)
    time.sleep(3600)  # rank 1 HUNG HERE; rank 0 waits for it in the next step's collective
"""


def test_a_stop_whose_rank_hung_before_it_does_not_wait_out_the_grace_period(tmp_path: Path) -> None:
    """SIGTERM to mlaunch a second after a rank hung (before the hang is judged): no rank can reach
    the agreed step, so the stop would sit out the grace period (the 300-fault storm: a hang, then a
    preemption, 10 s lost). Once the hang is judged (``hang_timeout`` without progress since before
    the stop), every rank is SIGKILLed and what they staged is left to the agent-side save."""
    job = plain_job(
        tmp_path, HUNG_THEN_STOPPED, extra="checkpoint: {grace_period: 120s}\nmonitor: {hang_timeout: 3s}\n"
    )
    run = Run(job)
    while run.first(r"rank 1 stepped") is None and run.proc.poll() is None:
        time.sleep(0.05)
    time.sleep(1.0)
    run.proc.send_signal(signal.SIGTERM)
    code = run.finish(90)  # before the fix: the 120 s grace period (less the agent-side save's share)
    assert code in (137, 143), run.text
    assert "hung before the stop: no rank can reach the agreed step; SIGKILL to rank 0, rank 1" in run.text, run.text
