"""The job-wide control plane between the node agents (every node's mlaunch): one package ``run/`` and ``health/`` use.

Node 0's mlaunch hosts a hub at the master address (``control.port``, default the
rendezvous port + 1000); every node's mlaunch joins it. Through it the first failure
anywhere reaches every node (each stops its ranks, the flash save agrees on a step, all
restart together at generation g+1), a node silent for ``monitor.node_timeout`` is declared
lost (the others stop and exit non-zero naming it), and node 0's exit code ends nodes that
follow it. Connections are CURVE-encrypted with keys derived from the per-job key, and only
its holders complete one (``transport``); every message is JSON signed with an HMAC-SHA256
under that key (``wire``); one that does not verify is dropped and counted.

The protocol (every message kind, its fields, who says it, which must arrive) is defined once,
in ``messages``; ``hub`` (node 0's thread, the one owner of the hub's state, publishing a
``HubView`` for node 0's other threads), ``membership`` (its decisions, returned as ``effects``),
``agent_core`` (an agent's side, its life in ``life``) and ``reductions`` say what each does.
Exchanges are named by ``topics`` and reduced by a ``reductions.Reduction``.

Costs, N nodes: per second the hub receives at most ~``cadence.AGENT_MESSAGES_PER_S``
messages in all (each agent's heartbeat and status intervals grow with N) and sends one
broadcast per interval: O(N) in total, O(1) per agent. Status goes up only: node 0 keeps
the whole view; other nodes get node 0's summary. An exchange is O(N) at the hub and O(1)
per agent where an aggregate will do (``count``, ``intersect``, ``max``, ``and``), and
node 0 alone gets the values it needs (``gather0``); ``all`` (every value to every node,
O(N²) in total) is kept for small jobs. The membership an exchange waits for is the
hub's state (``roster``), not a number fixed in each exchange.

Layering: this package imports neither ``launchers.run`` nor ``launchers.health``; both use it
(tests/test_layout.py). A local simulation (one mlaunch for every node) uses ``LocalEvents``:
the same interface, in process, no socket and no pyzmq import. ``open_job_events`` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launchers.control.events import (
    ExchangeFailed,
    ExchangeTimedOut,
    HubMovedAway,
    JobEnded,
    JobEvents,
    Left,
    LocalEvents,
    Lost,
    Meeting,
    Regroup,
    RemoteFailure,
)
from launchers.control.reductions import BUILTIN, How, Reducers, Reduction
from launchers.control.topics import Exchange
from launchers.log import say

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.platform.cluster import Cluster


def control_port(job: Job, master_port: int, engine_default: int = 0) -> int:
    """The control plane's port: job.yaml's ``control.port``, else the engine's (MPI: ``mpi.completion_port``),
    else the rendezvous port + the documented offset."""
    from launchers.config.monitor import CONTROL_PORT_OFFSET

    return job.control.port or engine_default or master_port + CONTROL_PORT_OFFSET


def node_timeout(job: Job) -> float:
    """``monitor.node_timeout``, or the MPI engine's older name for it (``mpi.node0_timeout``) when only that is set."""
    if "node_timeout" not in job.monitor.model_fields_set and job.mpi.node0_timeout is not None:
        return job.mpi.node0_timeout
    return job.monitor.node_timeout


def open_job_events(job: Job, cluster: Cluster, reducers: Reducers | None = None) -> JobEvents:
    """The control plane for this node: in process for one node or a simulation, else pyzmq to node 0's hub.

    ``reducers``: reductions beyond ``reductions.BUILTIN`` that exchanges use (the health check's).
    """
    table = {**BUILTIN, **(reducers or {})}
    if cluster.simulated or cluster.nnodes <= 1:
        return LocalEvents(table)
    from launchers.config.elastic import node_range
    from launchers.control.agent import NetworkEvents
    from launchers.control.wire import PUBLIC_KEY_WARNING, job_secret, keyed_from_public_facts

    port = control_port(job, cluster.master_port, cluster.control_port)
    secret = job_secret(job.job_name, cluster.master_addr, port, cluster.env, cluster.control_key)
    public = keyed_from_public_facts(cluster.env, cluster.control_key)
    if cluster.node_rank == 0 and public:
        say(PUBLIC_KEY_WARNING)  # once: node 0 opens its plane once per run
    events = NetworkEvents(
        node=cluster.node_rank,
        nnodes=cluster.nnodes,
        master_addr=cluster.master_addr,
        port=port,
        secret=secret,
        node_timeout=node_timeout(job),
        join_timeout=job.monitor.join_timeout,  # never shorter than node_timeout (the agent sees to it)
        elastic=node_range(job),  # the membership may change within it (``membership``)
        last_call=job.elastic.last_call,  # the first start waits this long for nodes beyond MIN
        reducers=table,
        hosts=cluster.hosts,  # where the hub moves when node 0 is lost (``succession``); none known: it cannot
    )
    events.keyed_from_public_facts = public  # shown by `mlaunch status`
    return events


__all__ = [
    "Exchange",
    "ExchangeFailed",
    "ExchangeTimedOut",
    "How",
    "HubMovedAway",
    "JobEnded",
    "JobEvents",
    "Left",
    "LocalEvents",
    "Lost",
    "Meeting",
    "Regroup",
    "Reducers",
    "Reduction",
    "RemoteFailure",
    "control_port",
    "node_timeout",
    "open_job_events",
]
