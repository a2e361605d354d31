"""What every engine shares: the interface and the helpers that build a process.

An engine answers two questions:
- ``detect``: which cluster is this node part of (platform env/args, or a local simulation)?
- ``plan``: which processes does each node start, with which argv/env/cwd?
Neither spawns a process nor writes a file. What a node needs on disk or running before an
attempt's processes start (the rank table a simulated Ascend job needs, MPI's sshd) is done by
``prepare``, which the runner calls with the plan and which returns how to undo it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from launchers.config.job import Job
from launchers.errors import UserError
from launchers.plan import LaunchPlan, Policy
from launchers.platform.cluster import Cluster

Cleanup = Callable[[], None]
# What an engine's detect() returns and its plan() reads: a platform Cluster, or the engine's own
# view of one (TensorflowCluster extends Cluster; AscendCluster holds one and reads through to it).
ClusterT = TypeVar("ClusterT")


class Engine(Protocol[ClusterT]):
    name: str

    def detect(
        self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], *, simulate: bool = False
    ) -> ClusterT:
        """Read this node's platform inputs (or simulate); user mistakes raise UserError."""
        ...

    def plan(self, job: Job, cluster: ClusterT, attempt: int = 0) -> LaunchPlan:
        """Pure: the processes of every node this machine runs, for restart ``attempt``."""
        ...

    def restart_cluster(self, cluster: ClusterT, attempt: int) -> ClusterT:
        """The cluster for restart ``attempt`` (a fresh rendezvous port)."""
        ...

    def prepare(self, job: Job, plan: LaunchPlan) -> Cleanup | None:
        """Node-level side effects before an attempt's processes start; returns their undo, or None if none."""
        ...


def entry_argv(job: Job) -> list[str]:
    """How to start the job's entry: python for .py, bash for .sh, else run it directly."""
    entry = job.entry_path
    suffix = entry.suffix.lower()
    if suffix == ".py":
        return [job.python or sys.executable, "-u", str(entry)]
    if suffix == ".sh":
        return ["bash", str(entry)]
    return [str(entry)]


def script_args(job: Job, cluster: Cluster) -> list[str]:
    """job.yaml args first, then what the platform appended that mlaunch did not consume."""
    return [*job.args, *cluster.extra_args]


def policy_of(job: Job) -> Policy:
    return Policy(
        grace_period=job.checkpoint.grace_period,
        max_restarts=job.restart.max_restarts,
        backoff=job.restart.backoff,
        max_backoff=job.restart.max_backoff,
        stop_timeout=job.restart.stop_timeout,
    )


def base_env(job: Job, attempt: int) -> dict[str, str]:
    """Env every process gets: job.yaml's env, unbuffered output, the restart attempt."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "MLAUNCH_JOB_NAME": job.job_name,
        "MLAUNCH_RESTART_COUNT": str(attempt),
        "MLAUNCH_MAX_RESTARTS": str(job.restart.max_restarts),
        "MLAUNCH_CHECKPOINT_DIR": str(job.resolve(job.checkpoint.dir)),
        "MLAUNCH_GRACE_PERIOD": f"{job.checkpoint.grace_period:g}",
    }
    env.update(job.env)
    return env


def log_file(job: Job, name: str) -> str:
    return str(job.log_path / f"{name}.log")


def restart_port(cluster: Cluster, attempt: int) -> int:
    """Rendezvous port for a restart: fresh when simulated; base + attempt on a platform.

    On a platform every node restarts on its own and must land on the same port without
    talking to the others, so the port is a function of the attempt number.
    """
    from launchers.platform.cluster import free_port

    if cluster.simulated:
        return free_port()
    port = cluster.master_port + attempt
    if port > 65535:
        raise UserError(f"restart {attempt} would use port {port}; lower the master port or max_restarts")
    return port


def check_entry_exists(job: Job) -> None:
    """Refuse to launch anything when the start file is missing (nothing starts half-way)."""
    entry = job.entry_path
    if not entry.exists():
        where = f" (entry {job.entry!r} in code_dir {job.code_path})" if not Path(job.entry).is_absolute() else ""
        src = f"{job.source}: " if job.source else ""
        raise UserError(f"{src}the start file {entry} does not exist{where}")
    if entry.suffix.lower() not in (".py", ".sh") and not os.access(entry, os.X_OK):
        raise UserError(f"the start file {entry} is not executable; make it executable or use a .py/.sh file")
