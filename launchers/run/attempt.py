"""One attempt of a run: supervise this node's processes, persist what they staged, say how it ended.

Per attempt (issue 4): the agent-side flash save (``flash_save``) when a worker fails — and after
a stop whose workers did not commit while grace time is left —, the background persist
(``checkpoint.persist_every``), the grace-budget monitor, warm standbys, and freeing the run's
shared memory when the attempt is over. ``attempt_exit_code`` turns the outcome into mlaunch's
exit code when the attempt ends the run (success, a stop) — the restart loop (``restarts``)
decides everything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launchers.config.job import Job
from launchers.elastic.ipc import completion, kept_segments, progress, staging
from launchers.engines.base import Engine
from launchers.log import say
from launchers.observe.observer import JobObserver
from launchers.outcome import Outcome, signal_name
from launchers.persist.flash_hook import FlashHook
from launchers.plan import FOLLOWER_ROLES, LaunchPlan, ProcessSpec
from launchers.rank_env import clear_error_files, error_file_lines
from launchers.run.hang import HangMonitor
from launchers.run.job_wide import job_failure
from launchers.run.labels import process_labels
from launchers.run.rejoin import RejoinWatch
from launchers.run.shm_reclaim import ShmReclaim, retire
from launchers.run.signal_router import SignalRouter
from launchers.run.supervisor import Output, Stopping, Supervisor, Watchers
from launchers.run.watchdog import Watchdog
from launchers.standby.standby_pool import StandbyPool

if TYPE_CHECKING:
    from launchers.control import JobEvents
    from launchers.persist.background_persist import BackgroundPersist
    from launchers.persist.commit_beside import CommitBeside
    from launchers.persist.flash_save import Exchange
    from launchers.persist.replication import Replication
    from launchers.run.in_place import Survivors


@dataclass
class RunContext:
    """What every attempt of one ``mlaunch run`` shares."""

    engine: Engine
    run_id: str
    signals: SignalRouter
    watchdog: Watchdog
    events: JobEvents
    observer: JobObserver
    standbys: StandbyPool | None = None
    replicas: Replication | None = None  # machine-loss replication (checkpoint.replicate, persist/replication.py)
    survivors: Survivors | None = None  # ranks kept through a peer's failure (``run.in_place``); None: never kept
    beside: CommitBeside | None = None  # the flash save's commit beside an in-place recovery (with ``survivors``)
    reclaim: ShmReclaim = field(default_factory=ShmReclaim)  # segments an attempt leaves, unlinked off the path


def finished_summary(outcome: Outcome, processes: Sequence[ProcessSpec]) -> str:
    """What a succeeded run says: service processes (ps, schedulers) stopped after the workers are not "exited 0"."""
    if processes and all(spec.role in FOLLOWER_ROLES for spec in processes):
        return "node 0 reports exit code 0 (this node's ranks ran under node 0's mpirun)"
    aborted = outcome.finished_aborts
    if aborted:
        return (
            f"every rank finished; {', '.join(aborted)} then aborted in interpreter teardown (exit code 0: the "
            "training completed)"
        )
    codes = list(outcome.exit_codes.values())
    stopped = sum(1 for code in codes if code != 0)
    if not codes or not stopped:
        return f"all {len(processes)} processes exited 0"
    return f"all {len(codes) - stopped} required processes exited 0; {stopped} service process(es) stopped after them"


def run_attempt(
    job: Job, plan: LaunchPlan, attempt: int, grace: float, run: RunContext, monitor: Callable[[], None]
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
    flash = _flash_hook(run, plan, attempt, grace, exchange, quiesce)
    run.observer.attempt_started(plan, attempt)
    try:
        supervisor = Supervisor(
            plan.processes,
            run_id=run.run_id,
            signals=run.signals,
            standbys=run.standbys,
            stopping=Stopping(grace, plan.policy.stop_timeout, flash.reserve),
            output=Output(labels=process_labels(plan), log_mode="wb" if attempt == 0 else "ab"),
            watchers=Watchers(
                job_events=run.events,
                hang=HangMonitor.for_plan(
                    job.monitor.hang_timeout,
                    plan,
                    run.run_id,
                    attempt,
                    job.monitor.first_report_within(),
                    job.monitor.node_timeout,
                ),
                on_failure=flash,
                tick=ticks(
                    monitor, run.observer.tick, *_background_ticks(background, run.observer), *_run_ticks(run, attempt)
                ),
                watchdog=run.watchdog,
                rejoin=_rejoin_watch(run.run_id, attempt, job.monitor.rejoin_timeout),
            ),
            in_place=run.survivors is not None,
            adopt=run.survivors.take() if run.survivors is not None else None,
        )
        flash.in_place = lambda: bool(supervisor.kept)  # survivors kept: the commit runs beside their recovery
        outcome = supervisor.run()
        _in_place_events(supervisor, run.survivors, run.observer, attempt)
    finally:
        if background is not None:
            background.stop()
        if cleanup is not None:
            cleanup()
    return _end_attempt(job, run, attempt, outcome, flash)


def _end_attempt(
    job: Job, run: RunContext, attempt: int, outcome: Outcome, flash: FlashHook
) -> tuple[Outcome, set[str]]:
    """After the supervisor: the dying checkpoint's commit, the outcome recorded, the attempt's memory released."""
    if outcome.status == "signalled":
        flash.after_stop(outcome)
    if run.replicas is not None:
        run.replicas.end(outcome)  # before the segments go: a node that left leaves the survivors' slots to commit
    outcome = job_failure(run.events, attempt, outcome)  # a hang only waited for here: the culprit's node's
    run.observer.attempt_ended(outcome)
    roots = flash.checkpoint_dirs(job)
    _release_shared_memory(run, attempt)
    return outcome, roots


def _flash_hook(
    run: RunContext,
    plan: LaunchPlan,
    attempt: int,
    grace: float,
    exchange: Any,
    quiesce: Callable[[], None] | None,
) -> FlashHook:
    """The flash save after a failure; its commits and its failures go to the status view and events."""
    on = run.observer
    return FlashHook(
        *(run.run_id, attempt, plan, grace, exchange, quiesce),
        on_commit=on.mlaunch_committed,
        on_failed=on.persist_failed,
        beside=run.beside,
    )


def _release_shared_memory(run: RunContext, attempt: int) -> None:
    """The attempt's staged state is persisted or obsolete, its progress files too; what recovers in place stays.

    Ranks kept through a peer's failure, and the failed rank's replacement, read the step the flash
    save decided from the segments kept here (``ipc.kept_segments``), not from the checkpoint
    directory; the last attempt's kept segments were read when its ranks started, and go once the
    commit beside that recovery (which reads them too) has ended.
    """
    if run.beside is not None:
        run.beside.release(attempt)
    retired = retire(staging.kept_segments(run.run_id))  # their pages are freed off the path (``reclaim``)
    if run.survivors:
        kept_segments.keep_for_next_attempt(run.run_id)
    retired += retire([*staging.run_segments(run.run_id), *staging.building_segments(run.run_id)])
    run.reclaim.unlink(retired)
    progress.unlink_run(run.run_id)
    completion.clear(run.run_id)


def _rejoin_watch(run_id: str, attempt: int, setting: float | str | None) -> RejoinWatch | None:
    """The attempt's bound on a group re-formed in place (``monitor.rejoin_timeout``); off: none, nothing read."""
    return RejoinWatch(run_id, attempt, setting) if setting is not None else None


def _in_place_events(supervisor: Supervisor, survivors: Survivors | None, observer: JobObserver, attempt: int) -> None:
    """Hand the kept ranks to the next attempt; say in ``events.jsonl`` what recovered in place and what could not."""
    if survivors is None:
        return
    if supervisor.rejoined:
        survivors.recoveries += 1
        observer.log.write("rejoined_in_place", attempt=attempt, ranks=supervisor.rejoined)
    if supervisor.kept:
        survivors.keep(supervisor.kept)
        observer.log.write("kept_in_place", attempt=attempt, ranks=[w.label for w in supervisor.kept])
    if supervisor.in_place_fallback:
        survivors.fallbacks += 1
        observer.log.write("in_place_fallback", attempt=attempt, reason=supervisor.in_place_fallback)


def _background_persist(
    job: Job, plan: LaunchPlan, attempt: int, run_id: str, exchange: Exchange | None
) -> BackgroundPersist | None:
    """``checkpoint.persist_every``'s background writer (imported only when it is on)."""
    if not job.checkpoint.persist_every:
        return None
    from launchers.persist.background_persist import BackgroundPersist

    return BackgroundPersist(run_id, attempt, plan, job.checkpoint.persist_every, exchange)


def _background_ticks(background: BackgroundPersist | None, observer: JobObserver) -> list[Callable[[], None]]:
    """The background writer's tick, and its commits into the status view (the ranks never report them)."""
    if background is None:
        return []

    def failed() -> None:
        for step, why in background.take_failed():
            observer.persist_failed("background", step, why)

    return [background.tick, lambda: observer.background_committed(background.committed), failed]


def _run_ticks(run: RunContext, attempt: int) -> list[Callable[[], None]]:
    """Replication's messages and figures (``mlaunch status``); a commit beside a recovery begun, its end said."""
    beside = run.beside
    found: list[Callable[[], None]] = [lambda: beside.tick(attempt)] if beside is not None else []
    replicas = run.replicas
    if replicas is None:
        return found
    return [*found, replicas.tick, lambda: run.observer.node_extra.update(replicas.status())]


def ticks(*calls: Callable[[], None]) -> Callable[[], None]:
    """One supervisor tick that runs each of ``calls`` in turn."""

    def tick() -> None:
        for call in calls:
            call()

    return tick


def attempt_exit_code(outcome: Outcome, plan: LaunchPlan, roots: set[str]) -> int | None:
    """mlaunch's exit code when the attempt ends the run (success, a stop); None after a failure or a re-form."""
    if outcome.status == "reformed":  # an elastic job's membership changed: the restart loop meets again
        return None
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

    from launchers.elastic.format import layout

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
