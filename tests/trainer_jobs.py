"""Run a trainer example under mlaunch, fault it, and count the steps lost (tests and benchmarks/trainers.py).

The examples (``examples/<framework>/train.py``) print, per rank, ``rank R pid P``, ``rank R start S``
(the step training begins from; once per attempt) and ``rank R step N`` after each step; rank 0 prints
``final-checksum <sha256>``. mlaunch prefixes each line with ``[node n rank r]``.

*Steps lost* by a fault (the issue's definition): the newest step every rank finished before the fault
minus the step training begins from afterwards.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^\[node \d+ rank \d+\] rank (\d+) (pid|start|step) (\d+)$")
# the integration's last word on SIGTERM: the step every rank stopped at, saved (a finished step)
STOPPED = re.compile(r"^\[node \d+ rank \d+\] mlaunch\.elastic\[rank (\d+)\]: stopped at step (\d+),")
CHECKSUM = re.compile(r"final-checksum ([0-9a-f]{64})")


def job_yaml(
    workdir: Path,
    framework: str,
    python: Path,
    args: list[str],
    *,
    restarts: int,
    grace: str = "30s",
    procs_per_node: int = 2,
    script: Path | None = None,
    preload: tuple[str, ...] = (),
) -> Path:
    """A 2 × ``procs_per_node`` job of ``examples/<framework>/train.py`` (or ``script``) run by ``python`` in
    ``workdir``.

    ``preload``: the modules a warm parent per node imports once, and every attempt's ranks are forked from it
    (restarts on, at least 1: the standbys exist only then). Each rank importing its framework cold costs
    2-6 s of CPU; forked, a trainer test took 57 CPU s instead of 141 (``test_hf_trainer_loses_no_step...``)."""
    job = workdir / "job.yaml"
    quoted = ", ".join(f'"{a}"' for a in [*args, "--output", str(workdir / "out")])
    script = script or ROOT / "examples" / framework / "train.py"
    job.write_text(
        f"name: {framework}-test\nengine: pytorch\nentry: {script.name}\npython: {python}\n"
        f"code_dir: {script.parent}\nargs: [{quoted}]\nnodes: 2\nprocs_per_node: {procs_per_node}\n"
        f"log_dir: {workdir / 'logs'}\n"
        "env: {GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: '1', DS_ACCELERATOR: cpu,"
        f" TORCH_EXTENSIONS_DIR: {extensions_dir(python)}}}\n"
        f"checkpoint: {{dir: {workdir / 'mlaunch-ckpt'}, grace_period: {grace}}}\n"
        f"restart: {{max_restarts: {max(restarts, 1) if preload else restarts}, backoff: 0s, stop_timeout: 2s}}\n"
        + (f"preload: [{', '.join(preload)}]\n" if preload else "")
    )
    return job


def extensions_dir(python: Path) -> Path:
    """Where DeepSpeed builds its C++ op (shm_comm, at start-up): beside the cached venv, so a machine whose
    test cache survives (``$MLAUNCH_TEST_CACHE``) builds it once, as it installs the venv once.

    A build that was killed leaves torch's ``lock`` file behind, and every later build waits on it for
    ever (a test run interrupted mid-build made each DeepSpeed test time out after 300 s): a lock older
    than any build (10 minutes) is removed, and said."""
    where = python.parent.parent / "torch_extensions"
    for lock in where.glob("*/lock"):
        with contextlib.suppress(OSError):
            if time.time() - lock.stat().st_mtime > 600:
                lock.unlink()
                print(f"removed a stale torch extension build lock: {lock}", file=sys.stderr)
    return where


@dataclass
class Attempt:
    """What one attempt (one start of the ranks) printed."""

    start: dict[int, int] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)  # rank → newest step it finished
    pids: dict[int, int] = field(default_factory=dict)
    world: int = 4

    def all_finished(self) -> int:
        """The newest step every rank finished (its ``start`` when a rank finished none)."""
        return min(self.steps.get(r, self.start.get(r, 0)) for r in range(self.world))


class Run:
    """One ``mlaunch`` run of a job, its output parsed as it arrives."""

    def __init__(self, job: Path, env: dict[str, str], world: int = 4) -> None:
        self.world = world
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)],
            cwd=job.parent,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.attempts: list[Attempt] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            self._parse(line)
            self._new.put(line)
        self._new.put(None)

    def _parse(self, line: str) -> None:
        if (stop := STOPPED.match(line)) and self.attempts:
            rank, step = int(stop.group(1)), int(stop.group(2))
            self.attempts[-1].steps[rank] = max(step, self.attempts[-1].steps.get(rank, -1))
        m = LINE.match(line)
        if not m:
            return
        rank, what, value = int(m.group(1)), m.group(2), int(m.group(3))
        if what == "pid" and (not self.attempts or rank in self.attempts[-1].pids):
            self.attempts.append(Attempt(world=self.world))
        if not self.attempts:
            self.attempts.append(Attempt(world=self.world))
        current = self.attempts[-1]
        if what == "pid":
            current.pids[rank] = value
        elif what == "start":
            current.start[rank] = value
        else:
            current.steps[rank] = max(value, current.steps.get(rank, -1))

    def wait_step(self, step: int, *, attempt: int, timeout: float = 300) -> None:
        """Until rank 0 of ``attempt`` (0-based) finished ``step`` and every rank printed its pid."""

        def reached() -> bool:
            if len(self.attempts) <= attempt:
                return False
            a = self.attempts[attempt]
            return a.steps.get(0, -1) >= step and len(a.pids) == self.world

        self._wait(reached, f"attempt {attempt} to reach step {step}", timeout)

    def wait_start(self, attempt: int, timeout: float = 300) -> int:
        """The step ``attempt`` begins from (rank 0's ``start`` line)."""
        self._wait(lambda: len(self.attempts) > attempt and 0 in self.attempts[attempt].start, "a restart", timeout)
        return self.attempts[attempt].start[0]

    def _wait(self, done: object, what: str, timeout: float) -> None:
        assert callable(done)
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.tail()}")
            try:
                if self._new.get(timeout=0.5) is None and not done():
                    raise AssertionError(f"mlaunch exited before {what}\n{self.tail()}")
            except queue.Empty:
                continue

    def kill_rank(self, rank: int, attempt: int, sig: int = signal.SIGKILL) -> None:
        os.kill(self.attempts[attempt].pids[rank], sig)

    def terminate(self) -> None:
        """SIGTERM to mlaunch (a platform's preemption): mlaunch forwards it to every rank."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.close()
        time.sleep(0.1)  # the pump read the last lines
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def checksum(self) -> str | None:
        found = [m.group(1) for line in self.lines if (m := CHECKSUM.search(line))]
        return found[-1] if found else None

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])


def steps_lost(before: Attempt, resumed_from: int) -> int:
    return before.all_finished() - resumed_from
