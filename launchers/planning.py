"""Plan a job: detect the cluster, let the engine plan an attempt, add what job-wide features need.

Pure (no process is started), shared by ``mlaunch plan``/``check`` and the run, and kept apart
from ``runner`` so that planning does not import the supervisor, the control plane and the
observer: ``mlaunch plan`` starts in the time it takes to plan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from launchers.config.engine_keys import check_engine_keys
from launchers.config.job import Job
from launchers.engines import get_engine
from launchers.engines.base import Engine
from launchers.errors import UserError
from launchers.plan import LaunchPlan
from launchers.platform.cluster import Cluster
from launchers.rank_env import add_rank_env


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
    check_engine_keys(job, engine_name)
    cluster = engine.detect(job, os.environ if env is None else env, extra_args, simulate=simulate)
    return engine, cluster, plan_attempt(engine, job, cluster, 0)


def plan_attempt(engine: Engine, job: Job, cluster: Cluster, attempt: int) -> LaunchPlan:
    """The engine's plan, plus what job-wide features add to it (high-availability side processes, env)."""
    plan = engine.plan(job, cluster, attempt)
    restated = cluster.rank_env  # an elastic job at another size: the platform's variables restated (resize.py)
    for proc in plan.processes:  # the elastic runtime's Checkpointer keeps this many
        proc.env.setdefault("MLAUNCH_CHECKPOINT_KEEP", str(job.checkpoint.keep))
        proc.env.setdefault("MLAUNCH_ON_UNREADABLE", job.checkpoint.on_unreadable)
        proc.env.update(restated)
    if job.high_availability.enabled:
        from launchers.engines.high_availability import apply_high_availability

        plan = apply_high_availability(job, cluster, plan)
    add_rank_env(job, plan)
    if plan.nnodes > 1 and not plan.simulated:  # the port of attempt 0's rendezvous: the same for every attempt
        from launchers.control import control_port  # multi-node only: off the plan command's path

        plan.control_port = control_port(job, cluster.master_port - attempt, cluster.control_port)
    return plan
