"""Platform detection: what the platform injected → a ``Cluster``.

Inputs, in order of precedence (the first that states a fact wins; a fact stated by two
inputs must agree, or detection fails with a message naming both):

1. **Arguments the platform appends** after the job's own (ModelArts PyTorch-GPU):
   ``--init_method tcp://IP:PORT --rank NODE --world_size NODES`` (``--k v`` or ``--k=v``).
   They are node-level: ``--rank`` is the node index, ``--world_size`` the number of nodes.
2. **A torch launcher's env**: Kubeflow PyTorchJob (``PET_NNODES``, ``PET_NODE_RANK``,
   ``PET_NPROC_PER_NODE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` =
   pods × nproc), MindCluster's ascend-operator (``MINDX_TASK_ID``/``LOCAL_WORLD_SIZE``;
   ``WORLD_SIZE`` counts devices), the Volcano pytorch plugin (``MASTER_ADDR``, ``RANK``,
   ``WORLD_SIZE`` = pods). Before them **Kubeflow Trainer v2** (``kubeflow-trainer``: ``PET_*``
   without ``MASTER_ADDR``, ``JOB_COMPLETION_INDEX``; ``trainer_env.py``); after them **SkyPilot**
   (``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS``, ``SKYPILOT_NUM_NODES``,
   ``SKYPILOT_NUM_GPUS_PER_NODE``; ``skypilot_env.py``).
   Then **Slurm** inside an allocation (``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST``,
   ``SLURM_NNODES``, ``SLURM_NODEID``, ``SLURM_GPUS_ON_NODE``; one mlaunch per node; ``slurm_env.py``).
3. **ModelArts env**: ``MA_NUM_HOSTS``, ``MA_NUM_GPUS``, ``VC_TASK_INDEX`` (fallback
   ``VK_TASK_INDEX``, ``MA_TASK_INDEX``), ``VC_WORKER_HOSTS`` or names built from
   ``MA_VJ_NAME``/``MA_TASK_NAME`` (``ma-job`` → ``modelarts-job``).
4. **Volcano svc/env plugins** alone: ``VC_WORKER_HOSTS``, ``VC_WORKER_NUM``, ``VC_TASK_INDEX``.
5. None of these → **local simulation**: nodes × processes from job.yaml on 127.0.0.1.

Processes per node: ``PET_NPROC_PER_NODE``, MindCluster ``LOCAL_WORLD_SIZE``, ``MA_NUM_GPUS``
(when > 0), else job.yaml's ``procs_per_node``.

Where each input is read: ``appended_args.py``, ``torch_env.py``, ``modelarts_env.py``
(ModelArts and Volcano); ``sighting.py`` merges what they say; ``detect`` here builds the
``Cluster``. This module is the import point for the engines.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from launchers.config.job import Job
from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE, MAX_SIMULATED_RANKS, MAX_WORLD_SIZE
from launchers.errors import PlatformError
from launchers.platform.appended_args import PYTORCH_PLATFORM_ARGS, from_args, split_platform_args
from launchers.platform.modelarts_env import from_modelarts_env, from_volcano_env, normalise_vj_name
from launchers.platform.sighting import Sighting, env_int, merge_sightings
from launchers.platform.skypilot_env import from_skypilot_env
from launchers.platform.torch_env import from_torch_env
from launchers.platform.trainer_env import from_trainer_env

__all__ = [
    "DEFAULT_MASTER_PORT",
    "LOOPBACK",
    "PYTORCH_PLATFORM_ARGS",
    "Cluster",
    "collect_sightings",
    "detect",
    "env_int",
    "free_port",
    "local_cluster",
    "normalise_vj_name",
    "split_platform_args",
]

DEFAULT_MASTER_PORT = 29500
LOOPBACK = "127.0.0.1"


@dataclass
class Cluster:
    """The job's shape as seen from this node."""

    source: str
    simulated: bool
    nnodes: int
    node_rank: int
    procs_per_node: int
    master_addr: str
    master_port: int
    hosts: list[str] = field(default_factory=list)  # per node index, when known
    extra_args: list[str] = field(default_factory=list)  # appended args not consumed: go to the script
    nnodes_spec: str | None = None  # elastic range such as "2:3" (torchrun style only)
    notes: list[str] = field(default_factory=list)
    platform_args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the environment detection saw
    control_port: int = 0  # the engine's port for the job's control plane (0: the documented default)
    control_key: str = ""  # a secret file every node holds, mixed into the control plane's key ("" if none)
    members: list[int] | None = None  # elastic: the platform's node indexes in the job now (None: all; resize.py)
    rank_env: dict[str, str] = field(default_factory=dict)  # the platform's shape variables restated for the ranks

    @property
    def world_size(self) -> int:
        return self.nnodes * self.procs_per_node

    def local_nodes(self) -> list[int]:
        """Indices of the nodes whose processes run on this machine."""
        return list(range(self.nnodes)) if self.simulated else [self.node_rank]

    def host_of(self, index: int) -> str:
        if self.simulated:
            return LOOPBACK
        if index < len(self.hosts):
            return self.hosts[index]
        return "localhost" if index == self.node_rank else f"node-{index}"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _slurm_sighting(env: Mapping[str, str]) -> Sighting | None:
    """Slurm's reader, imported only inside a Slurm job (its node-list parser is off the common path)."""
    if "SLURM_JOB_ID" not in env and "SLURM_JOBID" not in env:
        return None
    from launchers.platform.slurm_env import from_slurm_env

    return from_slurm_env(env)


def collect_sightings(env: Mapping[str, str], args: Mapping[str, str]) -> list[Sighting]:
    """Every platform input present, in precedence order."""
    found = [
        from_args(args),
        from_trainer_env(env),
        from_torch_env(env),
        from_skypilot_env(env),
        _slurm_sighting(env),
        from_modelarts_env(env),
    ]
    # VC_TASK_INDEX is an index *within a task*: with a master/worker torch env (Volcano
    # pytorch plugin, Kubeflow) it is not the node rank, so plain Volcano env is read only alone.
    if not any(found):
        found.append(from_volcano_env(env))
    sightings = [s for s in found if s is not None]
    # MA_NUM_GPUS alone does not make a platform (a laptop may have it set), but on a platform
    # node whose topology came from elsewhere (appended args) it still sets processes per node.
    if sightings and not any(s.source == "modelarts" for s in sightings):
        gpus = env_int(env, "MA_NUM_GPUS", maximum=MAX_PROCS_PER_NODE, meaning="accelerators per node")
        if gpus:
            extra = Sighting("modelarts")
            extra.put("nproc", gpus, f"MA_NUM_GPUS={gpus}")
            sightings.append(extra)
    return sightings


def detect(
    job: Job,
    env: Mapping[str, str],
    extra_args: Sequence[str] = (),
    *,
    consumes: Iterable[str] = PYTORCH_PLATFORM_ARGS,
    default_port: int = DEFAULT_MASTER_PORT,
    simulate: bool = False,
) -> Cluster:
    """Build the Cluster for this node from env + appended args (or simulate one locally)."""
    args, rest = split_platform_args(extra_args, consumes)
    sightings = [] if simulate else collect_sightings(env, args)
    if simulate and args:
        raise PlatformError(
            f"--simulate cannot be combined with platform arguments ({', '.join('--' + a for a in args)})"
        )
    if not sightings:
        return local_cluster(job, rest, env)
    facts = merge_sightings(sightings)
    sources = "+".join(s.source for s in sightings)
    nnodes = int(facts.get("nnodes", 1))  # type: ignore[call-overload]
    node_rank = _node_rank(facts, nnodes, sources)
    nproc, notes = _procs_per_node(job, facts, nnodes)
    hosts = list(facts.get("hosts", []))  # type: ignore[call-overload]
    check_world_size(nnodes, nproc, sources)
    return Cluster(
        source=sources,
        simulated=False,
        nnodes=nnodes,
        node_rank=node_rank,
        procs_per_node=nproc,
        master_addr=_master_addr(facts, hosts, nnodes, sources),
        master_port=int(facts.get("master_port") or job.pytorch.master_port or default_port),  # type: ignore[call-overload]
        hosts=hosts,
        extra_args=rest,
        nnodes_spec=facts.get("nnodes_spec"),  # type: ignore[arg-type]
        notes=notes,
        platform_args=dict(args),
        env=dict(env),
    )


def check_world_size(nnodes: int, nproc: int, sources: str) -> None:
    """The platform's shape within the documented limits (a plan for more would not finish in bounded time)."""
    if nnodes > MAX_NODES or nproc > MAX_PROCS_PER_NODE or nnodes * nproc > MAX_WORLD_SIZE:
        raise PlatformError(
            f"the platform ({sources}) asks for {nnodes} nodes × {nproc} processes = {nnodes * nproc} ranks; "
            f"mlaunch runs at most {MAX_NODES} nodes, {MAX_PROCS_PER_NODE} processes per node and "
            f"{MAX_WORLD_SIZE} ranks in total"
        )


def _node_rank(facts: dict[str, object], nnodes: int, sources: str) -> int:
    """This node's index, checked against the node count (0 on a single node or an elastic range)."""
    if "node_rank" not in facts:
        if nnodes > 1 and not facts.get("nnodes_spec"):  # an elastic range: torchrun's agent assigns ranks
            raise PlatformError(
                f"the platform ({sources}) says there are {nnodes} nodes but not which one this is; "
                "expected VC_TASK_INDEX (or VK_TASK_INDEX), RANK/PET_NODE_RANK, or --rank"
            )
        facts["node_rank"] = 0
    node_rank = int(facts["node_rank"])  # type: ignore[call-overload]
    if not 0 <= node_rank < nnodes:
        origins = facts["_origins"]
        assert isinstance(origins, dict)
        raise PlatformError(
            f"this node's index {node_rank} ({origins.get('node_rank')}) is outside 0..{nnodes - 1} "
            f"for {nnodes} nodes ({origins.get('nnodes', 'default')})"
        )
    return node_rank


def _procs_per_node(job: Job, facts: dict[str, object], nnodes: int) -> tuple[int, list[str]]:
    """Processes per node (the platform's, else job.yaml's) and notes where job.yaml is overruled."""
    notes: list[str] = []
    nproc = int(facts.get("nproc", job.procs_per_node))  # type: ignore[call-overload]
    if "nproc" in facts and job.procs_per_node not in (1, nproc):
        notes.append(
            f"job.yaml asks for procs_per_node: {job.procs_per_node}, the platform gives {nproc} "
            "per node; following the platform"
        )
    if job.nodes not in (1, nnodes):
        notes.append(f"job.yaml says nodes: {job.nodes}, the platform runs {nnodes}; following the platform")
    world_env = facts.get("world_size_env")
    if world_env is not None and world_env != nnodes * nproc and world_env != nnodes:
        raise PlatformError(
            f"platform env WORLD_SIZE={world_env} fits neither {nnodes} nodes × {nproc} processes "
            f"= {nnodes * nproc} nor {nnodes} pods; check PET_NNODES/PET_NPROC_PER_NODE"
        )
    return nproc, notes


def _master_addr(facts: dict[str, object], hosts: list[str], nnodes: int, sources: str) -> str:
    """The master's address: the platform's, else the first host; loopback only for a single node."""
    master_addr = str(facts.get("master_addr") or (hosts[0] if hosts else ""))
    if not master_addr:
        if nnodes > 1:
            raise PlatformError(
                f"the platform ({sources}) runs {nnodes} nodes but names no master address; expected "
                "--init_method tcp://HOST:PORT, MASTER_ADDR, VC_WORKER_HOSTS or MA_VJ_NAME"
            )
        master_addr = LOOPBACK
    return master_addr


def check_simulated_size(job: Job) -> None:
    """A local simulation runs every rank on this machine: at most ``MAX_SIMULATED_RANKS`` of them."""
    ranks = job.nodes * job.procs_per_node
    if ranks > MAX_SIMULATED_RANKS:
        raise PlatformError(
            f"nodes × procs_per_node = {job.nodes} × {job.procs_per_node} = {ranks} ranks, all on this machine "
            f"(no platform detected, so the job is simulated); a simulation runs at most {MAX_SIMULATED_RANKS}"
        )


def local_cluster(job: Job, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Cluster:
    """Simulate the platform: job.yaml's nodes × procs_per_node on loopback, a free port."""
    check_simulated_size(job)
    return Cluster(
        source="local-simulation",
        simulated=True,
        nnodes=job.nodes,
        node_rank=0,
        procs_per_node=job.procs_per_node,
        master_addr=LOOPBACK,
        master_port=job.pytorch.master_port or free_port(),
        hosts=[LOOPBACK] * job.nodes,
        extra_args=list(extra_args),
        env=dict(env or {}),
    )
