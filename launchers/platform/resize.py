"""The job at another size: the platform's cluster seen through the job's current membership (issue 27).

The platform numbers its nodes once (``VC_TASK_INDEX``, ``--rank``, ``SLURM_NODEID`` ...). When an
elastic job leaves a node out or takes one back, the job's node ranks are the members' positions
in the sorted list of their platform indexes: the lowest member (node 0 while it is in the job; the
next one once it is lost: ``control.succession``) is node rank 0 and hosts the rendezvous master,
the others close up. Everything a rank reads about the job's shape must say the same:
``RANK``/``WORLD_SIZE``/``NODE_RANK`` come from the engine's plan of the resized cluster, and the
platform's own variables that a script may read (``MA_NUM_HOSTS``, ``VC_TASK_INDEX``,
``VC_WORKER_HOSTS``, ``PET_NNODES`` ...) are restated for the ranks (``Cluster.rank_env``), each
only where the platform set it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from launchers.config.elastic import node_range
from launchers.config.job import Job
from launchers.config.loader import key_error
from launchers.platform.cluster import Cluster

COUNT_VARS = (
    "MA_NUM_HOSTS",
    "VC_WORKER_NUM",
    "PET_NNODES",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "SKYPILOT_NUM_NODES",
)
INDEX_VARS = ("VC_TASK_INDEX", "VK_TASK_INDEX", "MA_TASK_INDEX", "PET_NODE_RANK", "SLURM_NODEID", "SKYPILOT_NODE_RANK")
HOST_LISTS = {"VC_WORKER_HOSTS": ",", "SKYPILOT_NODE_IPS": "\n"}


def check_node_range(job: Job, cluster: Cluster) -> tuple[int, int] | None:
    """job.yaml's elastic range against the nodes the platform starts (exit 2 naming the key); the range or None."""
    span = node_range(job)
    if span is None:
        if job.elastic.model_fields_set:
            raise key_error(
                job,
                ["elastic"],
                "says when nodes join an elastic job, but the job has no elastic node range: set pytorch.nnodes "
                "such as '2:3' (not with pytorch.style: torchrun, whose agent runs the range itself)",
            )
        return None
    low, high = span
    nodes = cluster.nnodes
    if cluster.simulated:  # one mlaunch runs every node: nothing can leave or join (the engine says so)
        return span
    where = f"the platform ({cluster.source})"
    if not low <= nodes <= high:
        bound = f"at least {low}" if nodes < low else f"at most {high}"
        raise key_error(
            job,
            ["pytorch", "nnodes"],
            f"the elastic range {job.pytorch.nnodes} allows {bound} nodes; {where} starts {nodes}",
        )
    return span


def platform_index(cluster: Cluster) -> int:
    """This node's index as the platform numbers it (the membership's name for it)."""
    return cluster.node_rank if cluster.members is None else cluster.members[cluster.node_rank]


def resize(platform: Cluster, members: Sequence[int]) -> Cluster:
    """The platform's cluster with only ``members`` (platform indexes, this node among them) in the job."""
    ordered = sorted(set(members))
    me = platform.node_rank
    if me not in ordered:
        raise ValueError(f"node {me} cannot run as a member of {ordered} (this node must be in it)")
    if ordered == list(range(platform.nnodes)):
        return replace(platform, members=None, rank_env={})
    hosts = [platform.host_of(index) for index in ordered]
    rank = ordered.index(me)
    master = platform.master_addr if ordered[0] == 0 else hosts[0]  # the lowest member hosts it (``succession``)
    return replace(
        platform,
        master_addr=master,
        nnodes=len(ordered),
        node_rank=rank,
        hosts=hosts,
        members=ordered,
        rank_env=restated_env(platform.env, len(ordered), rank, hosts),
    )


def restated_env(env: dict[str, str], nnodes: int, rank: int, hosts: list[str]) -> dict[str, str]:
    """The platform's shape variables (only those it set) as the resized job has them."""
    out = {name: str(nnodes) for name in COUNT_VARS if name in env}
    out.update({name: str(rank) for name in INDEX_VARS if name in env})
    out.update({name: sep.join(hosts) for name, sep in HOST_LISTS.items() if name in env})
    return out
