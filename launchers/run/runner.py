"""Run a job: detect → plan → supervise, with restarts per policy.

This is the glue between the pure parts (engines produce a LaunchPlan) and the one place
that starts processes (``supervisor``, through ``attempt``). Everything that can be wrong with the
user's input is checked before the first process starts, so nothing is ever launched half-way.
The attempts follow one restart loop (``restarts``) whose membership policy is fixed, or elastic
with ``pytorch.nnodes: "MIN:MAX"`` (``membership``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from launchers import stop_signals as early_signals
from launchers.config.job import Job
from launchers.elastic.ipc import completion, kept_segments, progress, recovery, staging
from launchers.log import say
from launchers.observe.observer import JobObserver
from launchers.outcome import Outcome, signal_name
from launchers.plan import LaunchPlan
from launchers.planning import make_plan as make_plan
from launchers.planning import resolve_engine_name as resolve_engine_name
from launchers.platform.cluster import Cluster
from launchers.preflight import check_launchable
from launchers.procs import become_subreaper, kill_orphans, reap_unknown
from launchers.run import shm_sweep
from launchers.run.attempt import RunContext, attempt_exit_code, run_attempt, ticks
from launchers.run.attempt import finished_summary as finished_summary
from launchers.run.attempt import stop_exit_code as stop_exit_code
from launchers.run.restarts import FixedMembership, MembershipPolicy, RestartLoop, health_check
from launchers.run.signal_router import SignalRouter
from launchers.run.watchdog import Watchdog
from launchers.standby.standby_pool import StandbyPool

if TYPE_CHECKING:
    from launchers.control import JobEvents
    from launchers.engines.base import Engine
    from launchers.persist.commit_beside import CommitBeside

STANDBY_DELAY = 1.0  # seconds after an attempt starts before standbys start importing


def _sweep_dead_runs(run_id: str) -> None:
    """Take this run's shared-memory lock; remove what runs that died unlocked left there (said, never silent)."""
    shm_sweep.hold(run_id)  # the fd stays open for mlaunch's life: the lock is the run's sign of life
    files, runs = shm_sweep.sweep(run_id)
    if files:
        say(f"removed {files} shared-memory file(s) that {runs} dead run(s) left in {shm_sweep.shm_dir()}")


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
    from launchers.persist.grace_budget import prelaunch_warnings

    for warning in prelaunch_warnings(job):
        say(f"warning: {warning}")
    stop = early_signals.first_stop()
    if stop is not None:  # stopped while loading and planning: launch nothing
        say(f"stopped by {signal_name(stop)} before anything was launched")
        return 128 + stop
    run_id = secrets.token_hex(16)
    from launchers.control import open_job_events
    from launchers.health.network import REDUCERS

    events = open_job_events(job, cluster, REDUCERS)  # node 0's hub pairs the health check's links
    observer = JobObserver(job, plan, run_id, events)
    become_subreaper()
    _sweep_dead_runs(run_id)
    watchdog = Watchdog(run_id).start()  # after the run's lock is taken: the watchdog holds it too
    standbys = _standby_pool(job, plan, run_id, watchdog)
    beside = None
    run: RunContext | None = None
    code = 1
    try:
        with SignalRouter() as signals:
            run = RunContext(engine, run_id, signals, watchdog, events, observer, standbys)
            beside = _in_place(job, run)
            elastic = _elastic_span(job, events) is not None
            refused = None if elastic else health_check(job, cluster, events, run)  # elastic: per generation
            if refused is not None:
                code = refused
                return code
            code = _replicated_attempts(job, engine, cluster, plan, run)
            return code
    finally:
        if beside is not None:
            beside.wait("the run ends")  # it reads the kept segments; nothing it commits is lost
        observer.finished(code)
        events.close(code)
        if standbys is not None:
            standbys.close()
        _release_run_memory(run_id, run)
        watchdog.close()


def _release_run_memory(run_id: str, run: RunContext | None) -> None:
    """Nothing of the run stays in shared memory: what its attempts retired is unlinked first."""
    if run is not None:
        run.reclaim.wait()
    kept_segments.ended(run_id)
    staging.unlink_run(run_id)
    staging.unlink_kept(run_id)
    progress.unlink_run(run_id)
    completion.clear(run_id)
    recovery.unlink_run(run_id)


def _in_place(job: Job, run: RunContext) -> CommitBeside | None:
    """A job that restarts may recover in place (``run.in_place``), its flash save's commit beside the recovery."""
    if job.restart.max_restarts <= 0:
        return None
    from launchers.persist.commit_beside import CommitBeside
    from launchers.run.in_place import Survivors

    run.survivors = Survivors(run.run_id, say)
    run.beside = CommitBeside(run.run_id, run.observer.mlaunch_committed)
    return run.beside


def _standby_pool(job: Job, plan: LaunchPlan, run_id: str, watchdog: Watchdog) -> StandbyPool | None:
    """Warm standbys when the job restarts and has something to preload; the warm parent starts now,
    so that its imports overlap the rendezvous and the meeting (the first attempt's ranks fork from it)."""
    if job.restart.max_restarts <= 0 or not (job.preload or job.preload_learning):
        return None
    standbys = StandbyPool(
        job.preload,
        run_id=run_id,
        watchdog=watchdog,
        delay=STANDBY_DELAY,
        fork=job.preload_fork,
        learn=job.preload_learning,
        device=job.preload_device,
    )
    standbys.prestart(plan.processes, os.getpid())
    return standbys


def _elastic_span(job: Job, events: JobEvents) -> tuple[int, int] | None:
    """``pytorch.nnodes: "MIN:MAX"`` with one mlaunch per node: the job's membership can change."""
    from launchers.config.elastic import node_range

    return node_range(job) if events.networked else None


def _replicated_attempts(job: Job, engine: Engine, cluster: Cluster, plan: LaunchPlan, run: RunContext) -> int:
    """The attempts, with machine-loss replication around them where it applies (``persist/replication.py``)."""
    from launchers.persist.replication import for_run

    elastic = _elastic_span(job, run.events) is not None
    run.replicas = for_run(job.checkpoint.replicate, run.run_id, run.events, run.observer.log.write, elastic)
    try:
        return _attempts(job, engine, cluster, plan, run)
    finally:
        if run.replicas is not None:
            run.replicas.close()


def _attempts(job: Job, engine: Engine, cluster: Cluster, plan: LaunchPlan, run: RunContext) -> int:
    """Attempt after attempt, per the restart policy; the exit code mlaunch should exit with."""
    from launchers.persist.grace_budget import Monitor

    grace = plan.policy.grace_period
    monitor = Monitor(run.run_id, grace, say, declared_save=job.checkpoint.save_time)
    span = _elastic_span(job, run.events)
    policy: MembershipPolicy
    if span is not None:
        from launchers.run.membership import ElasticMembership

        policy = ElasticMembership(job, engine, cluster, span, run, plan)
    else:
        policy = FixedMembership(job, engine, cluster, plan, run)

    def attempt(plan: LaunchPlan, number: int, tick: Callable[[], None]) -> tuple[Outcome, set[str]]:
        return run_attempt(job, plan, number, grace, run, ticks(monitor, tick))

    try:
        return RestartLoop(job, run, policy, attempt, attempt_exit_code).run_all()
    finally:
        if run.survivors is not None and run.survivors.kill_all("the run ends without another attempt"):
            _sweep_orphans(run)


def _sweep_orphans(run: RunContext) -> None:
    """The orphan sweep an attempt that kept survivors left to the next one, when no next one came."""
    watchdog = {run.watchdog.pid} if run.watchdog.pid else set()
    kill_orphans(watchdog | (run.standbys.pids() if run.standbys is not None else set()))
    reap_unknown()
