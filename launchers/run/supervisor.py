"""Process supervision: one attempt of a group of processes, run to its end.

What a user relies on, and how it is done:
- Each worker runs in its own session/process group, so a signal reaches the worker *and*
  whatever it started (data-loader workers, a wrapper script's child) (``procs``).
- Output is streamed with a ``[rank N]`` prefix (``[node K rank N]`` when several nodes are
  simulated) and copied, unprefixed, to one log file per rank (``streams``, ``labels``).
- The first failure tears the group down: SIGTERM to every group, the grace period, then
  SIGKILL. The outcome carries the failing rank's own exit code (128+signal if it died of a
  signal) and the last lines of its output (``teardown``, ``outcome``).
- SIGTERM/SIGINT/SIGHUP to mlaunch are forwarded to every group; after the grace period
  the rest is SIGKILLed and mlaunch exits 128+signal. SIGUSR1/SIGUSR2 are forwarded as is
  (SLURM-style preemption notices), without stopping anything (``signal_router``).
- If mlaunch is SIGKILLed no worker survives: each worker has a parent-death signal, and a
  forked watchdog (which only waits for mlaunch's end of a pipe to close) kills every
  process group and every process carrying this run's ``MLAUNCH_RUN_ID`` (``watchdog``).
- No zombies: mlaunch is a child subreaper, the loop reaps every child (orphaned
  grandchildren included), and stragglers are killed at the end. This is also what makes
  mlaunch a correct PID 1 in a container.

The loop itself is one thread: one selector over the output pipes and a signal wake-up pipe
(SIGCHLD included), so there is no polling delay on exit. mlaunch has other threads (the control
plane's socket, node 0's hub, a flash save's commit beside an in-place recovery); a cold start's
fork runs only ``procs.start_process``'s child setup before exec, which takes no lock they hold.

Graceful-exit hooks (issue 4): ``on_failure`` runs right after the first failure, while the
other workers are frozen with SIGSTOP (the runner persists the ranks' staged state there);
then they get SIGTERM and SIGCONT — or SIGKILL when the hook says there is nothing left for
them to save; ``reserve`` says how much of the grace period to keep, on a stop by signal, for
persisting staged state of workers that never finish (hung, blocked in a collective);
``tick`` runs about twice a second (the grace-budget monitor); ``hang`` (a ``HangMonitor``)
is polled every pass: a rank that reported progress and then none for ``monitor.hang_timeout``
makes every process dump its stacks to its log, then it is a failure; a ``StandbyPool``
hands warm, pre-imported processes the workers' argv/env instead of starting cold ones.
The watchdog's final sweep also unlinks the run's shared-memory staging segments.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from launchers.elastic.ipc import completion, progress
from launchers.log import say, signal_name
from launchers.outcome import Failure, Outcome, exit_status, launch_failure, outcome_of
from launchers.plan import ProcessSpec, process_label
from launchers.procs import kill_orphans, process_env, start_process
from launchers.run import left_behind
from launchers.run.hang import HangMonitor, dump_stacks
from launchers.run.hang_response import HangResponse
from launchers.run.in_place import InPlaceResponse
from launchers.run.job_event_response import JobEventResponse
from launchers.run.rejoin import RejoinWatch
from launchers.run.signal_router import SignalRouter
from launchers.run.standby_response import StandbyResponse
from launchers.run.streams import OutputStreams, Worker
from launchers.run.teardown import Teardown
from launchers.run.watchdog import Watchdog
from launchers.standby.standby_pool import StandbyPool

if TYPE_CHECKING:
    from launchers.control import JobEvents


SWEEP_AFTER = 1.0  # seconds after an attempt that adopted survivors starts: the last one's orphans are killed


@dataclass(frozen=True)
class Stopping:
    """How a stop ends: SIGTERM, the grace period, then SIGKILL (``teardown``)."""

    grace_period: float = 30.0
    stop_timeout: float | None = None  # restart.stop_timeout: a failure's teardown, shorter than a preemption's
    reserve: Callable[[], float] | None = None  # seconds of a stop's grace period kept for the agent-side save


@dataclass(frozen=True)
class Output:
    """Where the workers' output goes: prefixed to mlaunch's stdout/stderr, unprefixed to one log per rank."""

    out: BinaryIO | None = None
    err: BinaryIO | None = None
    labels: dict[int, str] | None = None  # process index → its prefix (``[node K rank N]``)
    log_mode: str = "ab"  # "wb" on a job's first attempt
    announce: Callable[[str], None] | None = None  # mlaunch's own lines


@dataclass(frozen=True)
class Watchers:
    """Who else has a say in how the attempt ends, besides the workers' exits and mlaunch's signals."""

    job_events: JobEvents | None = None  # the control plane: failures and lost nodes elsewhere in the job
    hang: HangMonitor | None = None  # a rank whose progress stopped for monitor.hang_timeout
    on_failure: Callable[[Failure], str | None] | None = None  # the flash save, while the others are frozen
    tick: Callable[[], None] | None = None  # about twice a second (grace budget, background persist, status)
    watchdog: Watchdog | None = None  # kills what is left if mlaunch is SIGKILLed
    rejoin: RejoinWatch | None = None  # a group re-formed in place that reports too late (monitor.rejoin_timeout)


class Supervisor(HangResponse, JobEventResponse, InPlaceResponse, StandbyResponse):
    """Run one attempt of a group of processes to its end and report how it ended."""

    def __init__(
        self,
        processes: list[ProcessSpec],
        *,
        run_id: str = "",
        signals: SignalRouter | None = None,
        standbys: StandbyPool | None = None,
        stopping: Stopping = Stopping(),
        output: Output = Output(),
        watchers: Watchers = Watchers(),
        in_place: bool = False,
        adopt: dict[int, Worker] | None = None,
    ) -> None:
        self.processes = processes
        self.run_id = run_id
        self.signals = signals or SignalRouter()
        self.watchdog = watchers.watchdog
        self.labels = output.labels or {}
        self.announce = output.announce or say  # never raises: a closed stderr cannot break supervision
        self.log_mode = output.log_mode
        self.workers: list[Worker] = []
        self._by_pid: dict[int, Worker] = {}
        self.streams = OutputStreams(output.out or sys.stdout.buffer, output.err or sys.stderr.buffer)
        self.teardown = Teardown(
            stopping.grace_period,
            self._live,
            self.announce,
            stopping.reserve,
            stop_timeout=stopping.stop_timeout,
            guarded=lambda: progress.guarded_pids(run_id),
            unstarted=lambda: progress.unstarted_pids(run_id),
            keep=self._keep_in_place,
        )
        self.hang = watchers.hang
        self.rejoin = watchers.rejoin
        self._failure: Failure | None = None
        self._change = ""  # an elastic job's membership changed: the attempt ends re-formed, not failed
        self.finished_aborts: list[str] = []  # ranks that died after reporting completion (teardown aborts)
        self.exited_first: list[str] = []  # processes that exited 0 before any stop: their training finished
        self._parent_pid = os.getpid()
        self.standbys = standbys
        if standbys is not None:
            standbys.new_attempt()
        self.on_failure = watchers.on_failure
        self.tick = watchers.tick
        self._started = time.monotonic()
        self._next_tick = 0.0
        self._standbys_announced = False
        self.job_events = watchers.job_events
        # in-place recovery (``run.in_place``): survivors of the last attempt to adopt, and those kept for the next
        self.in_place = in_place
        self._adopt = dict(adopt or {})
        self.kept: list[Worker] = []
        self._kept_pids: set[int] = set()
        # survivors to adopt: the last attempt skipped its orphan sweep (off the recovery's path); this one sweeps
        self._sweep_due: float | None = time.monotonic() + SWEEP_AFTER if adopt else None
        self.rejoined: list[str] = []  # the labels of the adopted survivors
        self._told: dict[int, left_behind.Told] = {}
        self._replaced: dict[int, str] = {}
        self.in_place_fallback: str | None = None  # why ranks that declared it could not recover in place

    def run(self) -> Outcome:
        try:
            self._start_all()
            if self._failure is not None or self.teardown.signal is not None:
                self.teardown.stop_all(signal.SIGTERM)
            self._loop()
        finally:
            self._final_cleanup()
        return outcome_of(
            self.workers,
            self._failure,
            self.teardown.signal,
            grace_expired=self.teardown.grace_expired,
            stop_started=self.teardown.stop_started,
            change=self._change,
            finished_aborts=self.finished_aborts,
            finished=self._finished_training(),
        )

    def _finished_training(self) -> bool:
        """This node's ranks finished the training: one exited 0 before any stop, and every required one ended well."""
        if not self.exited_first or not self._required_ended_well():
            return False
        if self._change:
            self.announce(
                f"the training finished here ({', '.join(self.exited_first)} exited 0 before the stop) as the job "
                f"was to re-form ({self._change}): the job is complete, nothing re-forms"
            )
        return True

    # -- starting --------------------------------------------------------------------------
    def _start_all(self) -> None:
        if self.signals.active:
            self.streams.wake_on(self.signals.read_fd)
        if self.job_events is not None and self.job_events.wake_fd is not None:
            self.streams.wake_on(self.job_events.wake_fd)
        labelled = [(spec, self.labels.get(i) or process_label(spec)) for i, spec in enumerate(self.processes)]
        fresh, rejoining = self._replacements_first(labelled)
        self._start_processes(fresh)
        self._start_processes(self._adopt_survivors(rejoining))

    def _start_processes(self, to_start: list[tuple[ProcessSpec, str]]) -> None:
        """Start ``to_start`` (warm standbys forked first) until a stop signal or a failure comes."""
        self._fork_standbys_first([spec for spec, _ in to_start])
        for spec, label in to_start:
            for sig in self.signals.drain():
                self._on_signal(sig)
            if self.teardown.signal is not None or self._failure is not None:
                return
            try:
                self._spawn(spec, label)
            except OSError as exc:
                self._failure = launch_failure(spec, label, exc)
                return

    def _interrupted(self) -> bool:
        """A stop signal or a failure arrived (signals are handled here as the loop would)."""
        for sig in self.signals.drain():
            self._on_signal(sig)
        return self.teardown.signal is not None or self._failure is not None

    def _spawn(self, spec: ProcessSpec, label: str) -> None:
        env = process_env(spec.env, self.run_id)
        if self.standbys is not None:
            env.update(self.standbys.rank_env)  # preload_learning: the ranks report their imports
        log = None
        if spec.log:
            Path(spec.log).parent.mkdir(parents=True, exist_ok=True)
            log = open(spec.log, self.log_mode)  # noqa: SIM115 - closed by streams.close()
        try:
            popen = self._start(spec, env)
        except OSError:
            if log:
                log.close()
            raise
        worker = Worker(spec, label, f"[{label}] ".encode(), popen, log)
        self.workers.append(worker)
        self._by_pid[popen.pid] = worker
        self.streams.add(worker)

    def _start(self, spec: ProcessSpec, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Hand ``spec`` to a warm standby if one fits, else start it cold."""
        pool = self.standbys
        standby = pool.take(spec) if pool else None
        if standby is not None and pool is not None and pool.hand_off(standby, spec, env):
            return standby.popen  # already watched by the watchdog, in its own group
        if pool is not None and pool.compatible(spec):
            pool.cold_starts += 1
        popen = start_process(spec.argv, env, spec.cwd, self._parent_pid)
        if self.watchdog:
            self.watchdog.watch(popen.pid)
        return popen

    # -- the loop --------------------------------------------------------------------------
    def _live(self) -> list[Worker]:
        """The workers this attempt still runs (those kept for in-place recovery belong to the next attempt)."""
        return [w for w in self.workers if w.returncode is None and w.pid not in self._kept_pids]

    def _loop(self) -> None:
        while self._live():
            hang_due = self.hang.due_in() if self.hang is not None else 1.0  # a silent rank wakes nothing
            self.streams.wait(self.teardown.timeout(min(0.5 if self.signals.active else 0.05, hang_due)))
            for sig in self.signals.drain():
                self._on_signal(sig)
            self._reap()
            self._job_event()
            self._check_hang()
            self._check_left_behind()
            self._check_rejoin()
            self.teardown.enforce_grace()
            now = time.monotonic()
            self._refill_standbys(now)
            self._tick(now)
            self._sweep_if_due(now)

    def _tick(self, now: float) -> None:
        """The periodic hook, about twice a second; it may never break supervision."""
        if self.tick is not None and now >= self._next_tick:
            self._next_tick = now + 0.5
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - a monitor must never stop supervision
                self.announce(f"monitor error (ignored): {exc!r}")

    def dump_stacks(self) -> None:
        """Every live process writes its threads' Python stacks to its log (see ``launchers.run.hang``)."""
        dump_stacks(self._live(), run_id=self.run_id, pump=self.streams.wait, announce=self.announce)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            worker = self._by_pid.get(pid)
            if worker is not None and worker.returncode is None:
                self._on_exit(worker, status)

    def _on_exit(self, worker: Worker, status: int) -> None:
        code, sig = exit_status(status)
        worker.status = status
        worker.returncode = code
        worker.popen.returncode = code  # subprocess must not wait on a pid we reaped
        # Whatever the worker left in its group (a background child) goes with it.
        with contextlib.suppress(OSError):
            os.killpg(worker.pid, signal.SIGKILL)
        if self.watchdog:
            self.watchdog.unwatch(worker.pid)
        self.streams.drain(worker)
        if self.teardown.stopping:
            return
        if code == 0 and worker.spec.required:
            self.exited_first.append(worker.label)
        if code != 0 and self._finished_before(worker):
            self.finished_aborts.append(worker.label)
            how = f"was killed by {signal_name(sig)}" if sig is not None else f"exited with code {code}"
            self.announce(
                f"{worker.label} {how} after it reported that its training finished: an abort in interpreter "
                "teardown, not a failure of the job (nothing is restarted or flash-saved for it)"
            )
        elif code != 0:
            cause = self._replaced.pop(worker.pid, "")  # mlaunch's own kill of a survivor left behind
            self._failure = Failure(
                worker.label, worker.spec.rank, worker.pid, code, sig, list(worker.tail), worker.spec.log, cause
            )
            if self.job_events is not None:
                self.job_events.report_failure(self._failure)  # every node hears it before this one saves
            others = self._live()
            if others:
                self.announce(f"{self._failure.describe()}; stopping the other {len(others)} processes")
            self.teardown.after_failure(self._failure, self.on_failure)
            return
        if self._required_ended_well():
            services = [w for w in self._live() if not w.spec.required]
            if services:
                self.announce("every required process finished; stopping " + ", ".join(w.label for w in services))
                self.teardown.stop_all(signal.SIGTERM)

    def _required_ended_well(self) -> bool:
        """Every required process exited 0, or died in teardown after reporting its training finished."""
        return all(w.returncode == 0 or w.label in self.finished_aborts for w in self.workers if w.spec.required)

    def _finished_before(self, worker: Worker) -> bool:
        """The rank reported completion in this attempt (``launchers.elastic.ipc.completion``) before it exited."""
        if not self.run_id or worker.spec.rank < 0:
            return False
        attempt = int(worker.spec.env.get("MLAUNCH_RESTART_COUNT", "0") or 0)
        return worker.spec.rank in completion.finished_ranks(self.run_id, attempt)

    # -- the end ---------------------------------------------------------------------------
    def _final_cleanup(self) -> None:
        # Anything still alive (an exception in the loop) is killed; then the pipes are
        # drained, logs closed, orphans we adopted as subreaper killed and reaped.
        if self._live():
            self.teardown.signal_groups(signal.SIGKILL)
            end = time.monotonic() + 5
            while self._live() and time.monotonic() < end:
                self._reap()
                time.sleep(0.01)
        for worker in self.kept:
            self.streams.detach(worker)  # the next attempt adopts it, its pipes and its log
        self.streams.close()
        if not self.kept:  # with survivors kept, the next attempt sweeps once they were told (``_sweep_if_due``)
            self._sweep_orphans()
        self._reap()

    def _sweep_orphans(self) -> None:
        """Kill the orphans a dead rank left to us (a subreaper): one pass over /proc, milliseconds on a busy host."""
        self._sweep_due = None
        ours = set(self._by_pid) | self._kept_pids | ({self.watchdog.pid} if self.watchdog else set())
        kill_orphans(ours | (self.standbys.pids() if self.standbys else set()))

    def _sweep_if_due(self, now: float) -> None:
        """The last attempt's orphan sweep, left to this one so that its survivors were told first (``run``)."""
        if self._sweep_due is not None and now >= self._sweep_due:
            self._sweep_orphans()


__all__ = ["Supervisor"]
