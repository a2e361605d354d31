"""Hang detection on one node: ranks that reported progress and then none for ``monitor.hang_timeout``.

A rank that uses ``launchers.elastic`` (its progress file exists) but has reported nothing
``monitor.start_timeout`` after the attempt started is hung before its first step (a chaos storm
found one: a rank hung right after loading its checkpoint, its peers waited in the first step's
collective, and nothing was judged for 44 s until another fault came); judged the same way.

Ranks report progress through ``launchers.elastic`` (``guard.should_stop``, ``ckpt.stage``,
``elastic.heartbeat``) into per-process files in shared memory (``launchers.elastic.ipc.progress``);
the supervisor polls a ``HangMonitor`` a few times a second. A rank that never reported is not
judged. When ranks are hung, every rank of the node first writes the Python stacks of all its
threads to its own log (``dump_stacks``: the stack signal, SIGURG, to every process group —
``launchers.elastic`` registered ``faulthandler`` for it, so it works inside C code — and
``py-spy dump`` where installed for processes that did not register it); then the hang is a
failure like any other (flash save, restart or exit), exit code ``HANG_EXIT_CODE``.

Who is to blame: ranks blocked in a collective with a hung rank stop reporting too, at about
the same moment, so staleness cannot tell them apart. The progress file says whether a rank is
inside ``elastic.waiting()`` (``guard.should_stop``'s agreement, and whatever the script wraps,
e.g. DDP's backward): the ranks *outside* a collective wait are named first — with the
innermost frame of their main thread, read from the stacks they just wrote to their logs —
then the ranks that wait. On a node of a multi-node job whose stale ranks all wait, the rank
they wait for is on another node: this node declares ``WAITER_DEFER`` seconds later, so the
culprit's node (which detects it at the same moment) is the job's first failure.

A process that cannot be waiting for anyone comes before all of them: one stopped (process state
``T``: SIGSTOP, a debugger), in uninterruptible sleep (``D``: stuck in the kernel or a driver), or
that did not answer the stack request. And a rank whose stacks end in a ``torch.distributed``
collective waits in one even when the script wrapped nothing in ``elastic.waiting()``.

How long is too long: ``launchers.observe.hang_limit`` (``hang_timeout: auto`` learns it from the
job's own steps; a duration is fixed).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from launchers.config.durations import format_duration
from launchers.elastic.ipc import completion, progress
from launchers.observe import hang_limit
from launchers.outcome import Failure
from launchers.plan import LaunchPlan
from launchers.procs import STOPPED_STATES, process_state
from launchers.run.hang_stacks import DUMP_WAIT, answered_stack_request, log_marks, read_log_from
from launchers.run.hang_stacks import dump_stacks as dump_stacks
from launchers.run.hang_stacks import innermost_frame as innermost_frame
from launchers.run.streams import Worker

HANG_EXIT_CODE = 137  # as if SIGKILLed (what NVRx does to a hung rank): retryable for exit-code restart policies
# Seconds a node whose hung ranks all wait in a collective leaves to the culprit's node: that node judges its
# sleeper at about the same moment, then asks for stacks (up to DUMP_WAIT when a rank is slow to answer) before
# its declaration travels; a shorter wait let a loaded waiter's node declare its own waiting rank first (seen in CI).
WAITER_DEFER = hang_limit.WAITER_DEFER + DUMP_WAIT
# The poll after a rank's report is due when that rank reaches its limit (plus this), not at the next
# ``every`` tick: a 3 s hang_timeout polled every 0.25 s was judged 0.125 s late on average.
DUE_SLACK = 0.005


# A rank that reported completion (``elastic.finished()``, the integrations' ``finish()``) and has not exited yet is
# tearing down: the interpreter's last garbage collections of a program that imported transformers and DeepSpeed
# (half a million objects) took 8-12 s on 2 loaded cores, past the auto limit's 10 s floor, and the finished job
# was failed as hung. Such a rank is judged against this allowance (or its own limit, when longer) instead.
TEARDOWN_S = 120.0


@dataclass
class Stale:
    """A rank whose last progress report is older than the timeout."""

    report: progress.Progress
    worker: Worker
    host: str
    age: float
    frame: str | None = None  # innermost frame of its main thread, from the stacks it dumped
    verdict: hang_limit.Verdict | None = None  # the limit it was judged against
    state: str = ""  # its process state (/proc: R, S, D, T...) when judged, or after its stacks were asked for
    answered: bool | None = None  # it wrote stacks when asked (None: not known)

    @property
    def in_collective(self) -> bool:
        """Blocked on other ranks: inside ``elastic.waiting()``, or its stacks end in a collective."""
        return self.report.in_collective or (self.frame is not None and collective_frame(self.frame))

    @property
    def stuck(self) -> str | None:
        """Why this process cannot be waiting for another rank (stopped, in the kernel, deaf); None: it may be."""
        if self.state in STOPPED_STATES:
            return f"stopped (process state {self.state}: SIGSTOP or a debugger)"
        if self.state == "D":
            return "in uninterruptible sleep (process state D: stuck in the kernel or a driver)"
        if self.answered is False:
            return "did not answer the stack request"
        return None

    def describe(self) -> str:
        step = f"last step {self.report.step}" if self.report.step >= 0 else "no step number"
        return f"{self.worker.label} (host {self.host}, pid {self.report.pid}, {step}, {self.age:.1f}s ago)"


def _named(verdict: hang_limit.Verdict, silent: float) -> bool:
    """Named in a declared hang: hung, or silent half its limit (reported a moment after the culprit, waits for it)."""
    if verdict.hung:
        return True
    return verdict.rule in ("auto", "hang_timeout") and verdict.limit is not None and silent >= verdict.limit / 2


def blame_order(s: Stale) -> tuple[int, float, int]:
    """Who is named first: stuck processes, then ranks outside a collective wait, then the ones that wait."""
    return (0 if s.stuck else 1 if not s.in_collective else 2, s.report.monotonic, s.report.step)


# rendezvous.py: ``init_process_group``'s store, which waits for every rank of the world (rank 0's first of all)
_COLLECTIVE_FILES = ("distributed_c10d.py", "c10d_logger.py", "rendezvous.py")
# DDP all-reduces gradients from inside autograd's C++ backward: a rank blocked there for the whole hang limit
# waits for its peers' gradients. Seen on 2 netns hosts: the waiting node named its own rank in backward the
# culprit at the same moment as the sleeping rank's node, and a healthy rank was replaced.
_COLLECTIVE_FRAMES = (("graph.py", "_engine_run_backward"),)


def collective_frame(frame: str) -> bool:
    """An innermost frame where a rank waits for others: ``torch.distributed``'s collectives
    (``distributed_c10d.py:2871 in all_reduce``), its rendezvous (``rendezvous.py:199 in _create_c10d_store``),
    or DDP's backward (``graph.py:979 in _engine_run_backward``)."""
    file, _, rest = frame.partition(":")
    return file in _COLLECTIVE_FILES or (file, rest.partition(" in ")[2]) in _COLLECTIVE_FRAMES


class HangMonitor:
    """Read the attempt's progress files; say which live ranks stopped reporting for ``timeout`` seconds."""

    def __init__(
        self,
        run_id: str,
        attempt: int,
        timeout: float | str | None,
        hosts: dict[int, str] | None = None,
        defer: float = 0.0,
        start_timeout: float | None = None,
        node_timeout: float | None = None,
    ) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.timeout = timeout  # after a report: seconds, "auto" (learned) or None (only the start is judged)
        self.start_timeout = start_timeout  # before the first report (None: not judged)
        lost_after = hang_limit.others_lost_after(node_timeout or 0.0, defer > 0)  # defer > 0: several real nodes
        self.policy = hang_limit.Policy(timeout, start_timeout, lost_after)
        self.learned = hang_limit.for_run(run_id)  # the run's slowest step so far, kept across its attempts
        self.learned.new_attempt()
        self.started = time.monotonic()  # the attempt's start (its ranks start now, or became ranks now)
        self.hosts = hosts or {}
        self.defer = defer  # > 0 on a node of a multi-node job (other nodes may hold the culprit)
        fixed = hang_limit.FLOOR if self.policy.auto else timeout
        limits = [t for t in (fixed, start_timeout) if isinstance(t, float | int)]
        shortest = min(limits) if limits else 1.0
        self.every = min(0.25, max(shortest / 10, 0.05))
        self._next = 0.0
        self._only_waiters_since: float | None = None
        self._frames: dict[tuple[int, int], str | None] = {}  # (pid, report count) → the frame its stacks showed

    @classmethod
    def for_plan(
        cls,
        timeout: float | str | None,
        plan: LaunchPlan,
        run_id: str,
        attempt: int,
        start_timeout: float | None = None,
        node_timeout: float | None = None,
    ) -> HangMonitor | None:
        """The attempt's hang detection (``monitor.hang_timeout``, ``start_timeout``), or None when both are off."""
        if timeout is None and start_timeout is None:
            return None
        hosts = {proc.rank: node.host for node in plan.nodes for proc in node.processes if node.host}
        defer = WAITER_DEFER if plan.nnodes > 1 and not plan.simulated else 0.0
        return cls(run_id, attempt, timeout, hosts, defer, start_timeout, node_timeout)

    def _seen(self, report: progress.Progress, now: float) -> hang_limit.Seen:
        silent = now - (report.monotonic if report.count else self.started)
        idle = now - report.python_at if report.python_at > 0.0 else None
        return hang_limit.Seen(report.count, silent, idle)

    def stale(self, workers: list[Worker], now: float | None = None) -> list[Stale]:
        """The hung ranks among ``workers`` (live ones), the likeliest culprit first; [] between polls.

        Every poll also learns the step intervals (``hang_limit.StepTimes``). Nothing is declared
        while a silent rank of this node still runs Python (``hang_limit.hung_on_node``).
        """
        now = time.monotonic() if now is None else now
        if now < self._next:
            return []
        self._next = now + self.every
        judged = []
        finished = completion.finished_ranks(self.run_id, self.attempt)
        for report in progress.read_run(self.run_id):
            if report.attempt != self.attempt:
                continue
            if report.count:
                self.learned.learn(report.pid, report.count, report.monotonic)
            verdict = hang_limit.judge(self._seen(report, now), self.policy, self.learned.slowest)
            if verdict.limit is None:
                continue
            if not verdict.hung:  # the next poll no later than the moment this rank reaches its limit
                self._next = min(self._next, now + verdict.limit - self._seen(report, now).silent + DUE_SLACK)
            if report.rank in finished and self._seen(report, now).silent < max(verdict.limit, TEARDOWN_S):
                continue  # it finished training and is exiting: a large program's last collections take seconds
            worker = _owner(report, workers)
            if worker is None or not _alive(report.pid):
                continue
            host = self.hosts.get(worker.spec.rank) or socket.gethostname()
            age = self._seen(report, now).silent
            frame = self._frames.get((report.pid, report.count))  # this silence's stacks, when dumped already
            judged.append(Stale(report, worker, host, age, frame, verdict, process_state(report.pid)))
        stopped = any(s.verdict is not None and s.verdict.hung and s.state in STOPPED_STATES for s in judged)
        if not hang_limit.hung_on_node((s.verdict for s in judged if s.verdict is not None), stopped):
            return []
        found = sorted((s for s in judged if s.verdict is not None and _named(s.verdict, s.age)), key=blame_order)
        if found and found[0].in_collective and self.defer > 0:  # every one waits: the culprit is elsewhere
            self._only_waiters_since = self._only_waiters_since or now
            if now - self._only_waiters_since < self.defer:
                return []
        return found

    def waits_for_another_node(self, stale: list[Stale], now: float | None = None) -> bool:
        """After the stacks (``failure`` read their frames): on a node of a multi-node job whose hung ranks all
        wait in a collective and none is stuck, the culprit is on another node; True until ``defer`` seconds
        passed since this was first seen (the culprit's node declares meanwhile), then False: declared here."""
        if self.defer <= 0 or not stale or any(s.stuck or not s.in_collective for s in stale):
            return False
        now = time.monotonic() if now is None else now
        self._frames.update({(s.report.pid, s.report.count): s.frame for s in stale})  # ``stale`` defers from now on
        self._only_waiters_since = self._only_waiters_since or now
        return now - self._only_waiters_since < self.defer

    def due_in(self, now: float | None = None) -> float:
        """Seconds until the next poll of ``stale`` is due (0 when it is)."""
        return max(0.0, self._next - (time.monotonic() if now is None else now))

    def declared(self, stale: list[Stale]) -> None:
        """The hang was declared (its culprit first): twice at one step teaches ``auto`` (``after_hang``)."""
        first = stale[0]
        if self.policy.auto and first.report.count > 1:
            self.learned.hung(first.report.step, first.age)

    def limit_now(self) -> float | None:
        """The silence that makes a rank that reported (and is past its first step) hung now."""
        if self.policy.auto:
            return self.learned.limit(self.policy.others_lost_after)
        return self.timeout if isinstance(self.timeout, float | int) else None

    def log_marks(self, stale: list[Stale]) -> dict[int, tuple[str, int]]:
        """Where each hung rank stands in its log (pid → path, offset), before its stacks are asked for."""
        return log_marks(s.worker for s in stale)

    def failure(self, stale: list[Stale], marks: dict[int, tuple[str, int]] | None = None) -> Failure:
        """The failure the supervisor reports: the likeliest culprit first (``blame_order``), then the rest.

        ``marks`` (``log_marks`` taken before the stacks were asked for) says where to read each
        rank's stacks: its innermost frame, and whether it answered at all; without them neither
        is known and the order is the one ``stale`` found.
        """
        if marks:
            for s in stale:
                if s.worker.pid in marks:
                    text = read_log_from(*marks[s.worker.pid])
                    s.frame = innermost_frame(text)
                    if s.report.stack_signal:  # it registered the stack signal: it answers unless it cannot run
                        s.answered = answered_stack_request(text)
                s.state = process_state(s.report.pid) or s.state
            stale = sorted(stale, key=blame_order)
        first = stale[0]
        if first.report.count == 0:
            limit = format_duration(self.start_timeout or 0.0)
            cause = f"hung before its first step: no progress report {limit} after the attempt started "
            cause += f"(monitor.start_timeout) on host {first.host}, {_where(first)}"
        else:
            cause = f"hung: {self._silence(first)} on host {first.host}, last step {first.report.step}, {_where(first)}"
        stuck = [s for s in stale[1:] if s.stuck]
        outside = [s for s in stale[1:] if not s.stuck and not s.in_collective]
        waiting = [s for s in stale[1:] if not s.stuck and s.in_collective]
        if stuck:
            cause += "; also " + ", ".join(f"{s.describe()} {s.stuck}" for s in stuck)
        if outside:
            cause += "; also outside a collective: " + ", ".join(f"{s.describe()} {_where(s)}" for s in outside)
        if waiting:
            cause += "; waiting in a collective: " + ", ".join(_waits(s) for s in waiting)
        details: dict[str, Any] = {
            "outside_collective": [s.worker.spec.rank for s in stale if not s.in_collective],
            "in_collective": [s.worker.spec.rank for s in stale if s.in_collective],
            "frames": {str(s.worker.spec.rank): s.frame for s in stale if s.frame and not s.in_collective},
        }
        if any(s.stuck for s in stale):
            details["stuck"] = {str(s.worker.spec.rank): s.stuck for s in stale if s.stuck}
        if first.verdict is not None and first.verdict.rule in ("auto", "busy"):
            details["hang_limit_s"] = round(first.verdict.limit or 0.0, 3)
            details["slowest_step_s"] = round(self.learned.slowest or 0.0, 3)
        w = first.worker
        tail = list(w.tail)
        return Failure(w.label, w.spec.rank, w.pid, HANG_EXIT_CODE, None, tail, w.spec.log, cause, details)

    def _silence(self, s: Stale) -> str:
        """``no progress for …`` and the rule that judged it."""
        verdict = s.verdict or hang_limit.Verdict(True, self.limit_now(), "hang_timeout")
        limit = format_duration(verdict.limit or 0.0)
        if verdict.rule == "hang_timeout":
            return f"no progress for {limit} (monitor.hang_timeout)"
        if verdict.rule == "first_step":
            return f"no progress for {limit} after its first report, in its first step (monitor.start_timeout)"
        slowest = self.learned.slowest
        learned = f"{hang_limit.K:g} × slowest step {slowest:.3g}s" if slowest is not None else "no step measured"
        how = f"monitor.hang_timeout: auto = max({learned}, floor {format_duration(hang_limit.FLOOR)})"
        if verdict.rule == "busy":
            return f"no progress for {limit} although it still runs Python ({how}, then monitor.start_timeout)"
        if self.policy.others_lost_after > hang_limit.auto_limit(slowest):
            how += f", no less than monitor.node_timeout + {WAITER_DEFER:g}s on several nodes"
        return f"no progress for {s.age:.1f}s ({how} = {format_duration(self.limit_now() or 0.0)})"


def _waits(s: Stale) -> str:
    return s.describe() + (f" in {s.frame}" if s.frame and collective_frame(s.frame) else "")


def _where(s: Stale) -> str:
    if s.stuck:
        return s.stuck
    if s.in_collective and s.frame and collective_frame(s.frame):
        return f"waiting in a collective, innermost frame {s.frame} (no rank of this node is outside one)"
    if s.in_collective:
        return "waiting in a collective (no rank of this node is outside one)"
    return "outside any collective wait" + (f", innermost frame {s.frame}" if s.frame else "")


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
