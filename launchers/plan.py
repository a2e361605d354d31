"""LaunchPlan: the one currency between engines and everything else.

An engine turns (Job, Cluster) into a LaunchPlan without starting a process or writing a
file; ``mlaunch plan`` prints it, the supervisor runs it, tests assert on it. Keeping this
pure data (as TorchX keeps ``submit_dryrun`` apart from ``schedule``) makes every engine
testable without running anything.

``to_json()`` keeps the public keys of the contract —
``{"engine", "world_size", "nodes": [{"index", "host", "processes": [{"rank", "local_rank",
"argv", "env", "cwd"}]}]}`` — and adds a few more (``log``, ``role``, ``policy``...).
``env`` is what mlaunch sets, never the inherited environment.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launchers.platform.cluster import Cluster

# Roles of processes that only follow node 0 (the MPI engine's peer: node 0's mpirun runs this
# node's ranks through its sshd). They end when node 0 says the job ended, with its exit code.
FOLLOWER_ROLES = ("peer",)


@dataclass
class ProcessSpec:
    """One process mlaunch starts: its place in the job and exactly how to start it."""

    rank: int
    local_rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str | None = None
    role: str = "worker"
    # A process whose exit decides the job's outcome. Services (TF parameter servers, a
    # MindSpore scheduler) are stopped once every required process has succeeded.
    required: bool = True
    label: str | None = None  # output prefix; default "rank N"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": self.cwd,
            "role": self.role,
            "required": self.required,
        }
        if self.log is not None:
            data["log"] = self.log
        return data


@dataclass
class BootstrapStep:
    """Node-level work before the processes start (sshd, hostfile, peer wait, hooks)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params}


@dataclass
class NodePlan:
    index: int
    host: str
    processes: list[ProcessSpec]
    bootstrap: list[BootstrapStep] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "host": self.host,
            "processes": [p.to_json() for p in self.processes],
            "bootstrap": [b.to_json() for b in self.bootstrap],
        }


@dataclass
class Policy:
    grace_period: float = 30.0
    max_restarts: int = 0
    backoff: float = 1.0
    max_backoff: float = 60.0
    stop_timeout: float | None = None  # SIGTERM → SIGKILL of a failure-triggered stop; None: the grace period

    def to_json(self) -> dict[str, Any]:
        return {
            "grace_period": self.grace_period,
            "max_restarts": self.max_restarts,
            "backoff": self.backoff,
            "max_backoff": self.max_backoff,
            "stop_timeout": self.stop_timeout,
        }


@dataclass
class LaunchPlan:
    engine: str
    world_size: int
    nodes: list[NodePlan]
    policy: Policy = field(default_factory=Policy)
    source: str = "local-simulation"  # which platform input the cluster came from
    simulated: bool = True
    nnodes: int = 1  # nodes in the whole job (``nodes`` may list only this one on a platform)
    master_addr: str = ""
    master_port: int = 0
    attempt: int = 0
    notes: list[str] = field(default_factory=list)  # warnings worth showing before launch
    control_port: int = 0  # the job-wide control plane's port on master_addr (0: none, one node or simulated)

    @classmethod
    def for_cluster(
        cls,
        engine: str,
        cluster: Cluster,
        nodes: list[NodePlan],
        *,
        policy: Policy,
        attempt: int,
        world_size: int | None = None,
        notes: Sequence[str] = (),
    ) -> LaunchPlan:
        """The plan of ``nodes`` on ``cluster``: its shape, source and rendezvous address, its notes then ``notes``.

        ``world_size`` is the cluster's unless the engine counts ranks its own way (a rank table).
        """
        return cls(
            engine=engine,
            world_size=cluster.world_size if world_size is None else world_size,
            nodes=nodes,
            policy=policy,
            source=cluster.source,
            simulated=cluster.simulated,
            nnodes=cluster.nnodes,
            master_addr=cluster.master_addr,
            master_port=cluster.master_port,
            attempt=attempt,
            notes=[*cluster.notes, *notes],
        )

    @property
    def processes(self) -> list[ProcessSpec]:
        return [p for node in self.nodes for p in node.processes]

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "world_size": self.world_size,
            "nodes": [n.to_json() for n in self.nodes],
            "nnodes": self.nnodes,
            "source": self.source,
            "simulated": self.simulated,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "attempt": self.attempt,
            "policy": self.policy.to_json(),
            "notes": list(self.notes),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False)

    def headline(self) -> str:
        where = "local simulation" if self.simulated else f"platform: {self.source}"
        return (
            f"engine {self.engine}  world size {self.world_size}  nodes {self.nnodes}  "
            f"master {self.master_addr}:{self.master_port}  ({where})"
        )


def process_label(proc: ProcessSpec, node: int | None = None) -> str:
    """What a process is called in output prefixes and messages: its own label, else
    ``rank N`` (a worker), ``<role> N`` or ``<role>``; ``node K …`` first when given."""
    if proc.label:
        base = proc.label
    elif proc.role == "worker":
        base = f"rank {proc.rank}"
    else:
        base = f"{proc.role} {proc.rank}" if proc.rank >= 0 else proc.role
    return base if node is None or base.startswith("node ") else f"node {node} {base}"


def proc_title(proc: ProcessSpec) -> str:
    """The plan view's name of a process: its label, plus the local rank for a worker."""
    title = process_label(proc)
    return f"{title} (local {proc.local_rank})" if proc.role == "worker" else title
