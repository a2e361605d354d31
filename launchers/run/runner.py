"""Run a job: detect → plan → supervise, with restarts per policy.

This is the glue between the pure parts (engines produce a LaunchPlan) and the one place
that starts processes (``supervisor``). Everything that can be wrong with the user's input
is checked before the first process starts, so nothing is ever launched half-way.

Graceful exit (issue 4) adds, per attempt: the agent-side flash save (``flash_save``) when
a worker fails — and after a stop whose workers did not commit while grace time is left —,
the grace-budget monitor, warm standby workers for restarts when job.yaml lists
``preload:`` modules, and freeing the run's shared memory when the attempt is over.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launchers.config.job import Job
from launchers.control import node_timeout
from launchers.elastic import progress, staging
from launchers.engines.base import Engine
from launchers.log import say
from launchers.phases import long_phase
from launchers.plan import FOLLOWER_ROLES, LaunchPlan, ProcessSpec
from launchers.platform.cluster import Cluster
from launchers.run import signals as early_signals
from launchers.run.flash_hook import FlashHook
from launchers.run.hang import HangMonitor
from launchers.run.labels import process_labels
from launchers.run.observe.observer import JobObserver
from launchers.run.outcome import Outcome, signal_name
from launchers.run.planning import make_plan as make_plan
from launchers.run.planning import plan_attempt
from launchers.run.planning import resolve_engine_name as resolve_engine_name
from launchers.run.preflight import check_launchable
from launchers.run.procs import become_subreaper
from launchers.run.rank_env import clear_error_files, error_file_lines
from launchers.run.replication import Replication, for_run
from launchers.run.signal_router import SignalRouter
from launchers.run.standby_pool import StandbyPool
from launchers.run.supervisor import Supervisor
from launchers.run.watchdog import Watchdog

if TYPE_CHECKING:
    from launchers.control import JobEvents
    from launchers.run.background_persist import BackgroundPersist
    from launchers.run.flash_save import Exchange

STANDBY_DELAY = 1.0  # seconds after an attempt starts before standbys start importing


def finished_summary(outcome: Outcome, processes: Sequence[ProcessSpec]) -> str:
    """What a succeeded run says: service processes (ps, schedulers) stopped after the workers are not "exited 0"."""
    if processes and all(spec.role in FOLLOWER_ROLES for spec in processes):
        return "node 0 reports exit code 0 (this node's ranks ran under node 0's mpirun)"
    codes = list(outcome.exit_codes.values())
    stopped = sum(1 for code in codes if code != 0)
    if not codes or not stopped:
        return f"all {len(processes)} processes exited 0"
    return f"all {len(codes) - stopped} required processes exited 0; {stopped} service process(es) stopped after them"


def run_job(
    job: Job,
    engine_name: str,
    extra_args: Sequence[str] = (),
    *,
    simulate: bool = False,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run this node's share of the job; return the exit code mlaunch should exit with."""
    engine, cluster, plan = make_plan(job, engine_name, extra_args, env, simulate=simulate)
    check_launchable(job, plan)  # the same checks as `mlaunch check`: nothing starts on bad input
    for note in plan.notes:
        say(f"note: {note}")
    from launchers.run.grace_budget import prelaunch_warnings

    for warning in prelaunch_warnings(job):
        say(f"warning: {warning}")
    stop = early_signals.first_stop()
    if stop is not None:  # stopped while loading and planning: launch nothing
        say(f"stopped by {signal_name(stop)} before anything was launched")
        return 128 + stop
    run_id = secrets.token_hex(16)
    from launchers.control import open_job_events

    events = open_job_events(job, cluster)
    observer = JobObserver(job, plan, run_id, events)
    become_subreaper()
    watchdog = Watchdog(run_id).start()
    standbys = None
    if job.restart.max_restarts > 0 and (job.preload or job.preload_learning):
        standbys = StandbyPool(
            job.preload,
            run_id=run_id,
            watchdog=watchdog,
            delay=STANDBY_DELAY,
            fork=job.preload_fork,
            learn=job.preload_learning,
        )
    code = 1
    try:
        with SignalRouter() as signals:
            run = _Run(engine, run_id, signals, watchdog, events, observer, standbys)
            run.span = _elastic_span(job, events)
            refused = None if run.span else _health_check(job, cluster, events, observer)  # elastic: per generation
            if refused is not None:
                code = refused
                return code
            code = _replicated_attempts(job, cluster, plan, run)
            return code
    finally:
        observer.finished(code)
        events.close(code)
        if standbys is not None:
            standbys.close()
        staging.unlink_run(run_id)
        progress.unlink_run(run_id)
        watchdog.close()


@dataclass
class _Run:
    """What every attempt of one ``mlaunch run`` shares."""

    engine: Engine
    run_id: str
    signals: SignalRouter
    watchdog: Watchdog
    events: JobEvents
    observer: JobObserver
    standbys: StandbyPool | None = None
    span: tuple[int, int] | None = None  # an elastic node range mlaunch runs (run/membership.py)
    replicas: Replication | None = None  # machine-loss replication (checkpoint.replicate, run/replication.py)


def _elastic_span(job: Job, events: JobEvents) -> tuple[int, int] | None:
    """``pytorch.nnodes: "MIN:MAX"`` with one mlaunch per node: the job's membership can change."""
    from launchers.config.elastic import node_range

    return node_range(job) if events.networked else None


def _replicated_attempts(job: Job, cluster: Cluster, plan: LaunchPlan, run: _Run) -> int:
    """The attempts, with machine-loss replication around them where it applies (``run/replication.py``)."""
    elastic = run.span is not None
    run.replicas = for_run(job.checkpoint.replicate, run.run_id, run.events, run.observer.log.write, elastic)
    try:
        return _attempts(job, cluster, plan, run)
    finally:
        if run.replicas is not None:
            run.replicas.close()


def _attempts(job: Job, cluster: Cluster, plan: LaunchPlan, run: _Run) -> int:
    """Attempt after attempt, per the restart policy; the exit code mlaunch should exit with."""
    from launchers.run.grace_budget import Monitor
    from launchers.run.job_wide import job_exit_code, meet_before_restart

    attempt = 0
    policy = plan.policy
    monitor = Monitor(run.run_id, policy.grace_period, say, declared_save=job.checkpoint.save_time)
    if run.span is not None:
        from launchers.run.membership import Elastic, Steps, elastic_attempts

        def one(plan: LaunchPlan, attempt: int, tick: Callable[[], None]) -> tuple[Outcome, set[str]]:
            return _attempt(job, plan, attempt, policy.grace_period, run, _ticks(monitor, tick))

        elastic = Elastic(job, run.engine, cluster, run.span, run.events, run.observer, run.signals, run.standbys, plan)
        return elastic_attempts(elastic, Steps(one, _run_exit_code))
    while True:
        outcome, roots = _attempt(job, plan, attempt, policy.grace_period, run, monitor)
        code = _run_exit_code(outcome, plan, roots)
        if code is not None:
            return code
        code, lost = job_exit_code(run.events, attempt, outcome)
        if lost:
            return code
        if attempt >= policy.max_restarts:
            if policy.max_restarts:
                say(f"giving up after {attempt} restart(s) (restart.max_restarts: {policy.max_restarts})")
            return code
        delay = min(policy.backoff * (2**attempt), policy.max_backoff)
        attempt += 1
        warm = f" from {run.standbys.ready_count()} warm standbys" if run.standbys is not None else ""
        say(f"restarting the group ({attempt}/{policy.max_restarts}) in {delay:g}s{warm}")
        run.observer.restarting(attempt, delay)
        received = [s for s in run.signals.wait(delay) if s in early_signals.STOP_SIGNALS]
        if received:
            say(f"received {signal_name(received[0])} while waiting to restart; not restarting")
            return 128 + received[0]
        with long_phase("waiting for every node before the restart"):
            met = meet_before_restart(run.events, attempt, node_timeout(job) + 5)
        if not met:
            return code
        run.events.start_generation(attempt)
        refused = _health_check(job, cluster, run.events, run.observer)  # again before each restart
        if refused is not None:
            return refused
        cluster = run.engine.restart_cluster(cluster, attempt)
        plan = plan_attempt(run.engine, job, cluster, attempt)


def _attempt(
    job: Job, plan: LaunchPlan, attempt: int, grace: float, run: _Run, monitor: Callable[[], None]
) -> tuple[Outcome, set[str]]:
    """Supervise one attempt, then persist what its ranks staged; its outcome and checkpoint directories."""
    cleanup = run.engine.prepare(job, plan)
    say(plan.headline() + (f"  attempt {attempt}" if attempt else ""))
    clear_error_files(plan)
    run.events.start_generation(attempt)
    exchange = run.events.reduce if run.events.networked else None
    if run.replicas is not None and exchange is not None:  # after a node loss: the survivors commit first
        run.replicas.on_commit = run.observer.mlaunch_committed
        run.replicas.begin(plan, attempt, exchange)
    background = _background_persist(job, plan, attempt, run.run_id, exchange)
    quiesce = background.stop if background else None
    flash = FlashHook(run.run_id, attempt, plan, grace, exchange, quiesce, on_commit=run.observer.mlaunch_committed)
    run.observer.attempt_started(plan, attempt)
    try:
        outcome = Supervisor(
            plan.processes,
            grace_period=grace,
            run_id=run.run_id,
            signals=run.signals,
            watchdog=run.watchdog,
            labels=process_labels(plan),
            log_mode="wb" if attempt == 0 else "ab",
            standbys=run.standbys,
            on_failure=flash,
            tick=_ticks(monitor, run.observer.tick, *_background_ticks(background, run.observer), *_replica_ticks(run)),
            reserve=flash.reserve,
            job_events=run.events,
            hang=HangMonitor.for_plan(job.monitor.hang_timeout, plan, run.run_id, attempt),
            stop_timeout=plan.policy.stop_timeout,
        ).run()
    finally:
        if background is not None:
            background.stop()
        if cleanup is not None:
            cleanup()
    if outcome.status == "signalled":
        flash.after_stop(outcome)
    if run.replicas is not None:
        run.replicas.end(outcome)  # before the segments go: a node that left leaves the survivors' slots to commit
    run.observer.attempt_ended(outcome)
    roots = flash.checkpoint_dirs(job)
    staging.unlink_run(run.run_id)  # this attempt's staged state is persisted or obsolete
    progress.unlink_run(run.run_id)
    return outcome, roots


def _background_persist(
    job: Job, plan: LaunchPlan, attempt: int, run_id: str, exchange: Exchange | None
) -> BackgroundPersist | None:
    """``checkpoint.persist_every``'s background writer (imported only when it is on)."""
    if not job.checkpoint.persist_every:
        return None
    from launchers.run.background_persist import BackgroundPersist

    return BackgroundPersist(run_id, attempt, plan, job.checkpoint.persist_every, exchange)


def _background_ticks(background: BackgroundPersist | None, observer: JobObserver) -> list[Callable[[], None]]:
    """The background writer's tick, and its commits into the status view (the ranks never report them)."""
    if background is None:
        return []
    return [background.tick, lambda: observer.background_committed(background.committed)]


def _replica_ticks(run: _Run) -> list[Callable[[], None]]:
    """Replication's messages, and its figures in this node's status entry (``mlaunch status``)."""
    replicas = run.replicas
    if replicas is None:
        return []
    return [replicas.tick, lambda: run.observer.node_extra.update(replicas.status())]


def _health_check(job: Job, cluster: Cluster, events: JobEvents, observer: JobObserver) -> int | None:
    """The node health check when job.yaml turns it on (``launchers.health``, imported only then)."""
    if not job.health_check.before_start:
        return None
    from launchers.health.gate import before_start

    return before_start(job, cluster, events, observer.health)


def _ticks(*calls: Callable[[], None]) -> Callable[[], None]:
    """One supervisor tick that runs each of ``calls`` in turn."""

    def tick() -> None:
        for call in calls:
            call()

    return tick


def _run_exit_code(outcome: Outcome, plan: LaunchPlan, roots: set[str]) -> int | None:
    """mlaunch's exit code when the attempt ends the run (success, a stop); None after a failure."""
    if outcome.status == "succeeded":
        say(f"job finished: {finished_summary(outcome, plan.processes)}")
        return 0
    if outcome.status == "signalled":
        assert outcome.signal is not None
        code = stop_exit_code(outcome, roots)
        say(f"stopped by {signal_name(outcome.signal)}; exit code {code}")
        return code
    report_failure(outcome, plan.processes)
    return None


def stop_exit_code(outcome: Outcome, roots: set[str]) -> int:
    """128+signal — or 137 when the grace period cut off a dying checkpoint that was being written.

    The code says whether the stop lost the dying checkpoint: a platform's restart policy
    treats both as retryable, a person reading it learns that resume falls back to an older
    checkpoint. A worker that failed while stopping (its save failed: disk full...) is reported.
    """
    from pathlib import Path

    from launchers.elastic import layout

    assert outcome.signal is not None
    clean = {0, 128 + outcome.signal, 143}
    for label, code in outcome.exit_codes.items():
        if code not in clean and not (outcome.grace_expired and code == 137):
            say(f"{label} exited with code {code} while stopping; its dying checkpoint may not be committed")
    if not outcome.grace_expired or outcome.stop_started is None:
        return 128 + outcome.signal
    began = time.time() - (time.monotonic() - outcome.stop_started) - 1.0
    for root in sorted(roots):
        newest = layout.newest_step(Path(root))
        cut = [p for p in layout.partial_dirs(Path(root), after=newest) if _mtime(p) >= began]
        if cut:
            fallback = f"step {newest}" if newest is not None else "no checkpoint (a fresh start)"
            say(
                f"the grace period ended while {cut[0].name} was being written: it was NOT committed; "
                f"a resume falls back to {fallback}; exit code 137"
            )
            return 137
    return 128 + outcome.signal


def _mtime(path: Any) -> float:
    try:
        return float(path.stat().st_mtime)
    except OSError:
        return 0.0


def report_failure(outcome: Outcome, processes: list[ProcessSpec]) -> None:
    failure = outcome.failure
    if failure is None:
        return
    lines = [f"job failed: {failure.describe()}"]
    if failure.tail:
        where = f" (full log: {failure.log})" if failure.log else ""
        lines.append(f"last lines of {failure.label}{where}:")
        lines.extend(f"    {line}" for line in failure.tail[-10:])
    lines.extend(error_file_lines(processes, failure.rank))
    say("\n".join(lines))
