"""Run a job: detect → plan → supervise, with restarts per policy.

This is the glue between the pure parts (engines produce a LaunchPlan) and the one place
that starts processes (``supervisor``). Everything that can be wrong with the user's input
is checked before the first process starts, so nothing is ever launched half-way.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from launchers.engines import get_engine
from launchers.engines.base import Engine, check_entry_exists
from launchers.errors import UserError
from launchers.job import Job
from launchers.plan import LaunchPlan, ProcessSpec
from launchers.platform import Cluster
from launchers.supervisor import (
    Outcome,
    SignalRouter,
    Supervisor,
    Watchdog,
    become_subreaper,
    signal_name,
)


def say(message: str) -> None:
    sys.stderr.write(f"mlaunch: {message}\n")
    sys.stderr.flush()


def resolve_engine_name(job: Job, engine: str | None) -> str:
    """``--engine`` wins over job.yaml's ``engine:``; neither is a user error."""
    name = engine or job.engine
    if not name:
        src = job.source or "job.yaml"
        raise UserError(f"no engine given: pass --engine pytorch|ascend|tensorflow|mpi or set `engine:` in {src}")
    return name


def make_plan(
    job: Job,
    engine_name: str,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    simulate: bool = False,
) -> tuple[Engine, Cluster, LaunchPlan]:
    """Detect the cluster and plan attempt 0 — pure, used by both ``plan`` and ``run``."""
    engine = get_engine(engine_name)
    cluster = engine.detect(job, os.environ if env is None else env, extra_args, simulate=simulate)
    return engine, cluster, plan_attempt(engine, job, cluster, 0)


def plan_attempt(engine: Engine, job: Job, cluster: Cluster, attempt: int) -> LaunchPlan:
    """The engine's plan, plus what job-wide features add to it (high-availability side processes, env)."""
    plan = engine.plan(job, cluster, attempt)
    if job.high_availability.enabled:
        from launchers.ha import apply_high_availability

        plan = apply_high_availability(job, cluster, plan)
    return plan


def process_labels(plan: LaunchPlan) -> dict[int, str]:
    """Output prefixes: ``rank N``, or ``node K rank N`` when several nodes run here."""
    several = len(plan.nodes) > 1
    labels: dict[int, str] = {}
    index = 0
    for node in plan.nodes:
        for proc in node.processes:
            base = proc.label or (f"rank {proc.rank}" if proc.role == "worker" else f"{proc.role} {proc.rank}")
            if several and not base.startswith("node "):
                base = f"node {node.index} {base}"
            labels[index] = base
            index += 1
    return labels


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
    check_entry_exists(job)
    for note in plan.notes:
        say(f"note: {note}")
    prepare: Callable[[Job, LaunchPlan], Any] | None = getattr(engine, "prepare", None)
    run_id = uuid.uuid4().hex
    become_subreaper()
    watchdog = Watchdog(run_id).start()
    try:
        with SignalRouter() as signals:
            return _attempts(job, engine, cluster, plan, prepare, run_id, signals, watchdog)
    finally:
        watchdog.close()


def _attempts(
    job: Job,
    engine: Engine,
    cluster: Cluster,
    plan: LaunchPlan,
    prepare: Callable[[Job, LaunchPlan], Any] | None,
    run_id: str,
    signals: SignalRouter,
    watchdog: Watchdog,
) -> int:
    attempt = 0
    policy = plan.policy
    while True:
        cleanup = prepare(job, plan) if prepare else None
        say(plan.headline() + (f"  attempt {attempt}" if attempt else ""))
        try:
            outcome = Supervisor(
                plan.processes,
                grace_period=policy.grace_period,
                run_id=run_id,
                signals=signals,
                watchdog=watchdog,
                labels=process_labels(plan),
                log_mode="wb" if attempt == 0 else "ab",
            ).run()
        finally:
            if callable(cleanup):
                cleanup()
        if outcome.status == "succeeded":
            say(f"job finished: all {len(plan.processes)} processes exited 0")
            return 0
        if outcome.status == "signalled":
            assert outcome.signal is not None
            say(f"stopped by {signal_name(outcome.signal)}; exit code {outcome.exit_code}")
            return outcome.exit_code
        report_failure(outcome, plan.processes)
        if attempt >= policy.max_restarts:
            if policy.max_restarts:
                say(f"giving up after {attempt} restart(s) (restart.max_restarts: {policy.max_restarts})")
            return outcome.exit_code
        delay = min(policy.backoff * (2**attempt), policy.max_backoff)
        attempt += 1
        say(f"restarting the group ({attempt}/{policy.max_restarts}) in {delay:g}s")
        received = [s for s in signals.wait(delay) if s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
        if received:
            say(f"received {signal_name(received[0])} while waiting to restart; not restarting")
            return 128 + received[0]
        cluster = engine.restart_cluster(cluster, attempt)
        plan = plan_attempt(engine, job, cluster, attempt)


def report_failure(outcome: Outcome, processes: list[ProcessSpec]) -> None:
    failure = outcome.failure
    if failure is None:
        return
    lines = [f"job failed: {failure.describe()}"]
    if failure.tail:
        where = f" (full log: {failure.log})" if failure.log else ""
        lines.append(f"last lines of {failure.label}{where}:")
        lines.extend(f"    {line}" for line in failure.tail[-10:])
    say("\n".join(lines))
