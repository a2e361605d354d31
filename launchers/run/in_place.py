"""In-place recovery, mlaunch's half: after a peer's failure the surviving ranks keep their processes.

The rank's half is ``launchers.elastic.in_place`` (``@elastic.recoverable``). Here:

- ``keep_decision`` (pure): after a failure, which live workers of this node stay up, or why none
  do. A worker stays when it declared itself recoverable (``ipc.recovery``), is not the one that
  failed (a crashed rank is gone; a hung one is SIGKILLed, which closes its sockets so that the
  survivors' pending collectives fail at once), and every required worker here declared itself: a
  rank that would not rejoin would leave the others waiting in ``init_process_group``.
- ``Survivors`` owns the kept workers between two attempts: the attempt that failed hands them
  over (``keep``), the next attempt adopts them (``take``) — it hands each the environment of its
  rank in the new attempt (``ipc.recovery.go``) instead of starting a process — and whatever ends
  the run first (giving up, a stop signal) kills them (``kill_all``).

Everything else is the ordinary restart loop: the attempt ends *failed*, the flash save commits
the newest step every rank staged while the ranks are frozen, the nodes meet, the next attempt is
planned (a fresh rendezvous port); only the failed rank's process is new (a warm standby). When
in-place recovery cannot apply, the whole job restarts as without the decorator, and that is said
(``fallback``) in the log and ``events.jsonl``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launchers.config.durations import format_duration
from launchers.elastic.ipc import progress, recovery
from launchers.outcome import Failure
from launchers.plan import ProcessSpec
from launchers.procs import STOPPED_STATES, process_env, process_state
from launchers.run import left_behind
from launchers.run.hang import collective_frame
from launchers.run.hang_stacks import dump_stacks as stacks_of
from launchers.run.hang_stacks import innermost_frame, log_marks, read_log_from
from launchers.run.rejoin import STALLED, RejoinWatch
from launchers.run.streams import OutputStreams, Worker

if TYPE_CHECKING:
    from launchers.control import JobEvents
    from launchers.run.teardown import Teardown
    from launchers.standby.standby_pool import StandbyPool


@dataclass(frozen=True)
class KeepDecision:
    """The workers that stay up through the recovery, or why none do (``fallback``; None: nothing to say).

    ``stuck``: live workers besides the failed one that cannot rejoin (stopped, or in uninterruptible sleep
    throughout the settle window): they are replaced with it, and that is said."""

    kept: list[Worker]
    fallback: str | None = None
    stuck: list[Worker] = field(default_factory=list)


def keep_decision(
    failure: Failure,
    live: Iterable[Worker],
    declared: set[int],
    stuck: Collection[int] | None = None,
) -> KeepDecision:
    """Which of this node's ``live`` workers recover in place after ``failure``.

    ``declared``: the recoverable pids; ``stuck``: pids stopped (state T) or in uninterruptible sleep (D)
    throughout ``stuck_pids``' window, which cannot rejoin whoever the hang detection named: they are
    replaced with the failed rank. A survivor cut off while its group was still forming is kept too: it
    re-forms in place as one cut off in a step does (``elastic.in_place._reset_group_names``).
    """
    stuck = set(stuck or ())
    live = list(live)
    replaced = [w for w in live if w.pid in stuck and w.pid != failure.pid]
    if failure.cause.startswith(STALLED):  # the last recovery in place never completed: not again
        return KeepDecision([], "the last in-place recovery did not complete within monitor.rejoin_timeout")
    if failure.cause.startswith("hung") and any(w.pid in stuck for w in live):
        culprits = stuck  # a stopped process is the hang, whichever rank the progress reports pointed at
    else:
        culprits = stuck | {failure.pid}
    others = [w for w in live if w.pid not in culprits]
    if not others:
        return KeepDecision([], stuck=replaced)
    recoverable = [w for w in others if w.pid in declared]
    if not recoverable:
        return KeepDecision([])  # no rank here uses ``@elastic.recoverable``: the ordinary restart, nothing to say
    required = [w for w in others if w.spec.required]
    missing = [w for w in required if w.pid not in declared]
    if missing:
        names = ", ".join(w.label for w in missing)
        return KeepDecision([], f"{names} did not declare @elastic.recoverable (not yet started, or not wrapped)")
    return KeepDecision(recoverable, stuck=replaced)


class Survivors:
    """The workers kept alive between a failed attempt and the next (one owner: the run's ``RunContext``)."""

    def __init__(self, run_id: str, announce: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.announce = announce
        self._kept: dict[int, Worker] = {}  # local rank → worker
        self.recoveries = 0  # attempts that adopted survivors
        self.fallbacks = 0  # failures that could not recover in place although ranks had declared it

    def keep(self, workers: Iterable[Worker]) -> None:
        for worker in workers:
            self._kept[worker.spec.local_rank] = worker

    def take(self) -> dict[int, Worker]:
        """The kept workers, for the next attempt to adopt (alive ones only; the rest are reaped by it)."""
        kept, self._kept = self._kept, {}
        return kept

    def __bool__(self) -> bool:
        return bool(self._kept)

    def kill_all(self, why: str) -> bool:
        """The run ends without a next attempt: nothing kept may outlive it. True when some were kept: the attempt
        that kept them left its orphan sweep to the next one (``Supervisor._final_cleanup``), which never came."""
        kept, self._kept = self._kept, {}
        alive = [w for w in kept.values() if w.returncode is None]
        if alive:
            self.announce(f"{why}; SIGKILL to the ranks kept for recovery: " + ", ".join(w.label for w in alive))
        for worker in alive:
            kill_and_reap(worker)
        return bool(kept)


def attempt_of(spec: ProcessSpec) -> int:
    """The attempt a process of ``spec`` belongs to (``MLAUNCH_RESTART_COUNT``)."""
    return int(spec.env.get("MLAUNCH_RESTART_COUNT", "0") or 0)


STUCK_SETTLE = 0.3  # seconds a process seen in uninterruptible sleep (D) must stay there to count as stuck
STUCK_POLL = 0.005


def stuck_pids(
    pids: Iterable[int],
    settle: float = STUCK_SETTLE,
    state_of: Callable[[int], str] = process_state,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, str]:
    """The processes among ``pids`` that cannot rejoin, with their state letter: stopped (T, t) now, or in
    uninterruptible sleep (D) throughout ``settle`` seconds.

    Why the window for D: a healthy rank writing its log or faulting in a page on a loaded machine is in D
    for milliseconds (on a busy CI disk, longer); one sample would replace it with the failed rank for no
    reason. A rank blocked on dead storage stays in D. The window is paid only when a process is seen in D,
    and only until it leaves; a stopped process stays stopped, so T needs no second look.
    """
    states = {pid: state_of(pid) for pid in pids}
    stuck = {pid: state for pid, state in states.items() if state in STOPPED_STATES}
    sleeping = {pid for pid, state in states.items() if state == "D"}
    end = time.monotonic() + settle
    while sleeping and time.monotonic() < end:
        sleep(STUCK_POLL)
        sleeping = {pid for pid in sleeping if state_of(pid) == "D"}
    stuck.update(dict.fromkeys(sleeping, "D"))
    return stuck


def state_words(state: str) -> str:
    """How the log names a stuck rank's state letter."""
    return "in uninterruptible sleep (D)" if state == "D" else f"stopped ({state})"


def kill_and_reap(worker: Worker) -> None:
    """SIGKILL ``worker``'s process group and reap it (it is mlaunch's child), closing its pipes and log."""
    with contextlib.suppress(OSError):
        os.killpg(worker.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(worker.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(worker.pid, 0)
    worker.returncode = worker.returncode if worker.returncode is not None else -signal.SIGKILL
    worker.popen.returncode = worker.returncode
    for stream in (worker.popen.stdout, worker.popen.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    if worker.log is not None:
        with contextlib.suppress(OSError):
            worker.log.close()


class InPlaceResponse:
    """The supervisor's part in in-place recovery (a mixin of ``Supervisor``: it owns these fields)."""

    run_id: str
    in_place: bool
    processes: list[ProcessSpec]
    workers: list[Worker]
    _by_pid: dict[int, Worker]
    streams: OutputStreams
    standbys: StandbyPool | None
    announce: Callable[[str], None]
    kept: list[Worker]
    _kept_pids: set[int]
    rejoined: list[str]
    in_place_fallback: str | None

    rejoin: RejoinWatch | None
    _replaced: dict[int, str]  # survivor pid → the failure cause of its death (it was left behind)
    _told: dict[int, left_behind.Told]  # survivor pid → when it was told ``go``, to which attempt, from which
    _failure: Failure | None
    teardown: Teardown
    job_events: JobEvents | None
    on_failure: Callable[[Failure], str | None] | None

    def _live(self) -> list[Worker]:
        raise NotImplementedError

    def dump_stacks(self) -> None:
        raise NotImplementedError

    _adopt: dict[int, Worker]

    def _check_left_behind(self) -> None:
        """A survivor that will not take its ``go`` is replaced, not waited for (``run.left_behind``: which, and why).

        Every other survivor takes it within milliseconds: its watcher shut down the last call's connections,
        its collective failed. One whose wait outlived that (gloo's send to a peer that closed first) would hold
        the new group in its rendezvous until ``monitor.rejoin_timeout`` restarted every rank; killed, it is one
        more failed rank, at once, and the others, cut off while forming the new group, re-form in place once
        more with its replacement."""
        if not self._told or self._failure is not None or self.teardown.stopping:
            return
        now = time.monotonic()
        for pid, told in list(self._told.items()):
            worker = self._by_pid.get(pid)
            joined, left = recovery.marks_of(self.run_id, pid)
            if worker is None or worker.returncode is not None or joined >= told.attempt:
                del self._told[pid]  # gone, or it took the go (its own mark says it joined the new attempt)
                continue
            left_behind.look(told, now, left_behind.sample(pid))
            why = left_behind.verdict(told, now, left >= told.held_in)
            if why is not None:
                del self._told[pid]
                self._replaced[pid] = left_behind.cause(told)  # its death is this, not a crash (``_on_exit``)
                self.announce(f"{worker.label} {why}: its stacks go to its log (what it waits in), then SIGKILL")
                stacks_of([worker], run_id=self.run_id, pump=self.streams.wait, announce=self.announce)
                self.announce(f"{worker.label} {why}: SIGKILL, it is replaced")
                with contextlib.suppress(OSError):
                    os.killpg(worker.pid, signal.SIGKILL)

    def _check_rejoin(self) -> None:
        """A group re-formed in place that has not reported within ``monitor.rejoin_timeout``: stacks, then a failure
        that no node recovers in place (``launchers.run.rejoin``): the whole job restarts."""
        if self.rejoin is None or self._failure is not None or self.teardown.stopping:
            return
        stalled = self.rejoin.poll(self._live(), bool(self.rejoined))
        if stalled is None:
            return
        names = ", ".join(w.label for w in stalled.waiting)
        limit = format_duration(stalled.limit)
        self.announce(
            f"the in-place recovery did not complete within {limit} (monitor.rejoin_timeout): {names} reported no "
            "progress in this attempt; writing every process's stacks to its log"
        )
        marks = log_marks(stalled.waiting)  # where each rank's stacks will start in its log
        self.dump_stacks()
        frames = {w.pid: innermost_frame(read_log_from(*marks[w.pid])) for w in stalled.waiting if w.pid in marks}
        outside = [w for w in stalled.waiting if (frame := frames.get(w.pid)) and not collective_frame(frame)]
        for worker in outside:  # the ranks not waiting for others: what kept the group from forming
            self.announce(f"{worker.label} is outside any collective wait; innermost frame: {frames[worker.pid]}")
        first = (outside or stalled.waiting)[0]
        cause = f"{STALLED} within {limit} after an in-place recovery (no progress report; monitor.rejoin_timeout)"
        tail, log = list(first.tail), first.spec.log
        self._failure = Failure(first.label, first.spec.rank, first.pid, 1, None, tail, log, cause)
        if self.job_events is not None:
            self.job_events.report_failure(self._failure)  # every node falls back, not only this one
        self.announce(f"stopping the {len(self._live())} processes: the whole job restarts instead")
        self.teardown.after_failure(self._failure, self.on_failure)

    def _replacements_first(
        self, labelled: list[tuple[ProcessSpec, str]]
    ) -> tuple[list[tuple[ProcessSpec, str]], list[tuple[ProcessSpec, str]]]:
        """The places no survivor takes (to start first), and those a survivor of the last attempt takes.

        After a fault recovered in place the failed rank's replacement has the longest way to the new
        group (a standby's hand-off, then the script from its top) while a survivor only calls its
        function again, and the group forms when its last member arrives: so the replacement starts first.
        """
        fresh = [(spec, label) for spec, label in labelled if spec.local_rank not in self._adopt]
        return fresh, [(spec, label) for spec, label in labelled if spec.local_rank in self._adopt]

    def _adopt_survivors(self, labelled: list[tuple[ProcessSpec, str]]) -> list[tuple[ProcessSpec, str]]:
        """The last attempt's survivors take their places (by local rank); what is left to start, in order."""
        to_start: list[tuple[ProcessSpec, str]] = []
        for spec, label in labelled:
            survivor = self._adopt.pop(spec.local_rank, None)
            if survivor is None or not self._rejoin(survivor, spec, label):
                to_start.append((spec, label))
        for survivor in self._adopt.values():  # no place for it in this attempt (the plan changed)
            self.announce(f"{survivor.label} has no place in this attempt; SIGKILL")
            kill_and_reap(survivor)
        self._adopt = {}
        return to_start

    def _rejoin(self, survivor: Worker, spec: ProcessSpec, label: str) -> bool:
        """A survivor of the last attempt takes ``spec``'s place in this one, in its own process; False: start it."""
        if survivor.returncode is not None or survivor.popen.poll() is not None or survivor.spec.argv != spec.argv:
            kill_and_reap(survivor)
            return False
        env = process_env(spec.env, self.run_id)
        if self.standbys is not None:
            env.update(self.standbys.rank_env)
        attempt, held_in = attempt_of(spec), attempt_of(survivor.spec)
        if not recovery.go(self.run_id, survivor.pid, attempt, env):
            self.announce(f"{survivor.label} cannot be told to rejoin (it left recovery); starting a new process")
            kill_and_reap(survivor)
            return False
        self._told[survivor.pid] = left_behind.Told(time.monotonic(), attempt, held_in)
        survivor.spec, survivor.label, survivor.prefix = spec, label, f"[{label}] ".encode()
        self.workers.append(survivor)
        self._by_pid[survivor.pid] = survivor
        self.streams.add(survivor)
        self.rejoined.append(label)
        return True

    def _keep_in_place(self, failure: Failure) -> list[Worker]:
        """After ``failure``: the workers here that recover in place (``run.in_place``), told to hold."""
        if not self.in_place or not self.run_id:
            return []
        live = self._live()
        stuck = stuck_pids(w.pid for w in live)
        attempt = attempt_of(self.processes[0]) if self.processes else 0
        if self.rejoin is not None and not self.rejoin.done:  # what the reports taught, before the workers leave
            self.rejoin.settle(progress.read_run(self.run_id), {w.pid for w in live})
        decision = keep_decision(failure, live, recovery.declared_pids(self.run_id), stuck)
        for worker in decision.stuck:  # never silent: these are replaced although nothing reported them failed
            state = state_words(stuck[worker.pid])
            self.announce(f"{worker.label} (pid {worker.pid}) is {state}: it cannot rejoin and is replaced")
        if decision.fallback:
            self.in_place_fallback = decision.fallback
            self.announce(f"cannot recover in place: {decision.fallback}; every rank here restarts")
        held = [w for w in decision.kept if recovery.hold(self.run_id, w.pid, attempt, failure.describe())]
        if len(held) < len(decision.kept):
            self.in_place_fallback = "a rank left recovery before it could be told to hold"
            self.announce(f"cannot recover in place: {self.in_place_fallback}; every rank here restarts")
            return []
        if held:
            self.kept, self._kept_pids = held, {w.pid for w in held}
            self.announce(
                f"{failure.label} failed: " + ", ".join(w.label for w in held) + " keep their processes and rejoin "
                "in place (@elastic.recoverable)"
            )
        return held
