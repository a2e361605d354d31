"""Hang detection on one node: ranks that reported progress and then none for ``monitor.hang_timeout``.

Ranks report progress through ``launchers.elastic`` (``guard.should_stop``, ``ckpt.stage``,
``elastic.heartbeat``) into per-process files in shared memory (``launchers.elastic.progress``);
the supervisor polls a ``HangMonitor`` a few times a second. A rank that never reported is not
judged. When ranks are hung, every rank of the node first writes the Python stacks of all its
threads to its own log (``dump_stacks``: the stack signal, SIGURG, to every process group —
``launchers.elastic`` registered ``faulthandler`` for it, so it works inside C code — and
``py-spy dump`` where installed for processes that did not register it); then the hang is a
failure like any other (flash save, restart or exit), exit code ``HANG_EXIT_CODE``.

Ranks blocked in a collective with a hung rank stop reporting too, at about the same moment:
every stale rank is named, the stalest first; the stacks in the logs show which one is stuck.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from launchers.config.durations import format_duration
from launchers.elastic import progress
from launchers.plan import LaunchPlan
from launchers.run.outcome import Failure
from launchers.run.procs import signal_group
from launchers.run.streams import Worker

HANG_EXIT_CODE = 137  # as if SIGKILLed (what NVRx does to a hung rank): retryable for exit-code restart policies
DUMP_WAIT = 2.0  # at most this long for the stacks to arrive before the stop goes on
DUMP_QUIET = 0.3  # ... or until the ranks have been silent this long after the signal
PY_SPY_TIMEOUT = 10.0


@dataclass
class Stale:
    """A rank whose last progress report is older than the timeout."""

    report: progress.Progress
    worker: Worker
    host: str
    age: float

    def describe(self) -> str:
        step = f"last step {self.report.step}" if self.report.step >= 0 else "no step number"
        return f"{self.worker.label} (host {self.host}, pid {self.report.pid}, {step}, {self.age:.1f}s ago)"


class HangMonitor:
    """Read the attempt's progress files; say which live ranks stopped reporting for ``timeout`` seconds."""

    def __init__(self, run_id: str, attempt: int, timeout: float, hosts: dict[int, str] | None = None) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.timeout = timeout
        self.hosts = hosts or {}
        self.every = min(0.25, max(timeout / 10, 0.05))
        self._next = 0.0

    @classmethod
    def for_plan(cls, timeout: float | None, plan: LaunchPlan, run_id: str, attempt: int) -> HangMonitor | None:
        """The attempt's hang detection (``monitor.hang_timeout``), or None when it is off."""
        if timeout is None:
            return None
        hosts = {proc.rank: node.host for node in plan.nodes for proc in node.processes if node.host}
        return cls(run_id, attempt, timeout, hosts)

    def stale(self, workers: list[Worker], now: float | None = None) -> list[Stale]:
        """The hung ranks among ``workers`` (live ones), stalest first; [] between polls."""
        now = time.monotonic() if now is None else now
        if now < self._next:
            return []
        self._next = now + self.every
        found = []
        for report in progress.read_run(self.run_id):
            if report.attempt != self.attempt or report.count == 0 or now - report.monotonic < self.timeout:
                continue
            worker = _owner(report, workers)
            if worker is None or not _alive(report.pid):
                continue
            host = self.hosts.get(worker.spec.rank) or socket.gethostname()
            found.append(Stale(report, worker, host, now - report.monotonic))
        found.sort(key=lambda s: (s.report.monotonic, s.report.step))
        return found

    def failure(self, stale: list[Stale]) -> Failure:
        """The failure the supervisor reports: the stalest rank, with every hung rank named."""
        first = stale[0]
        others = f"; also without progress: {', '.join(s.describe() for s in stale[1:])}" if stale[1:] else ""
        cause = (
            f"hung: no progress for {format_duration(self.timeout)} (monitor.hang_timeout) on host {first.host}, "
            f"last step {first.report.step}{others}"
        )
        w = first.worker
        return Failure(w.label, w.spec.rank, w.pid, HANG_EXIT_CODE, None, list(w.tail), w.spec.log, cause=cause)


def _owner(report: progress.Progress, workers: list[Worker]) -> Worker | None:
    """The supervised process a report belongs to: by pid, by rank, else the worker it descends from."""
    for worker in workers:
        if worker.pid == report.pid:
            return worker
    for worker in workers:
        if worker.spec.role == "worker" and worker.spec.rank == report.rank >= 0:
            return worker
    with contextlib.suppress(Exception):
        import psutil

        parents = {p.pid for p in psutil.Process(report.pid).parents()}
        return next((w for w in workers if w.pid in parents), None)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def dump_stacks(
    workers: list[Worker],
    *,
    run_id: str,
    pump: Callable[[float], bool],
    announce: Callable[[str], None],
) -> None:
    """Every process's Python stacks into its log, before anything is killed.

    The stack signal goes to each rank that registered it (``launchers.elastic``), and only to
    that process: its DataLoader workers inherited the handler and would write their stacks into
    the same log at the same moment, interleaved line by line. A process without a registered
    rank in its tree (a wrapper that started one some other way) gets it for its whole group
    (SIGURG is ignored by whoever did not register it); ranks that never imported
    ``launchers.elastic`` get ``py-spy dump`` when it is installed. ``pump`` reads the workers'
    output (so the stacks reach the logs) and says whether any arrived; this returns once they
    stopped arriving, within ``DUMP_WAIT``.
    """
    registered = {p.pid for p in progress.read_run(run_id) if p.stack_signal}
    unregistered = [w for w in workers if not _has_registered(w, registered)]
    for worker in unregistered:
        signal_group(worker.pid, progress.STACK_SIGNAL)
    for pid in registered:  # the rank alone, wherever it is (under a wrapper that made a group of its own too)
        with contextlib.suppress(OSError):
            os.kill(pid, progress.STACK_SIGNAL)
    spies = _py_spy(unregistered)
    end = time.monotonic() + DUMP_WAIT
    quiet_since = time.monotonic()
    while time.monotonic() < end:
        if pump(min(DUMP_QUIET, max(0.0, end - time.monotonic()))):
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= DUMP_QUIET:
            break
    _collect_py_spy(spies, announce)
    announce(f"stacks of {len(workers)} processes written to their logs (signal {progress.STACK_SIGNAL.name})")


def _has_registered(worker: Worker, registered: set[int]) -> bool:
    if worker.pid in registered:
        return True
    with contextlib.suppress(Exception):
        import psutil

        return any(child.pid in registered for child in psutil.Process(worker.pid).children(recursive=True))
    return False


def _py_spy(workers: Iterable[Worker]) -> list[tuple[Worker, subprocess.Popen[bytes]]]:
    exe = shutil.which("py-spy")
    if exe is None:
        return []
    spies = []
    for worker in workers:
        with contextlib.suppress(OSError):
            popen = subprocess.Popen(
                [exe, "dump", "--pid", str(worker.pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            spies.append((worker, popen))
    return spies


def _collect_py_spy(spies: list[tuple[Worker, subprocess.Popen[bytes]]], announce: Callable[[str], None]) -> None:
    for worker, popen in spies:
        try:
            out, _ = popen.communicate(timeout=PY_SPY_TIMEOUT)
        except subprocess.TimeoutExpired:
            popen.kill()
            out, _ = popen.communicate()
        text = out.decode("utf-8", "replace")
        if worker.log is not None and not worker.log.closed:
            with contextlib.suppress(OSError, ValueError):
                worker.log.write(f"py-spy dump of pid {worker.pid}:\n{text}".encode())
                worker.log.flush()
        announce(f"py-spy stacks of {worker.label} written to {worker.spec.log or 'nowhere (no log file)'}")
