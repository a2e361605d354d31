"""The job-wide control plane between the node agents (every node's mlaunch): one package ``run/`` and ``health/`` use.

Node 0's mlaunch hosts a hub at the master address (``control.port``, default the
rendezvous port + 1000); every node's mlaunch joins it. Through it:

- the first failure anywhere (a rank's exit ≠ 0) reaches every node at once: each node stops
  its ranks, the agent-side flash save agrees on the newest step every rank of every node
  staged, and all nodes restart together at generation g+1 (restart counts are job-wide);
- agents heartbeat; a node that stops answering for ``monitor.node_timeout`` is declared
  lost, and the others stop their ranks (no flash save: a mixed step is never committed)
  and exit non-zero naming it;
- every message is authenticated with a per-job secret (HMAC-SHA256, ``wire``).

Messages (``hub`` and ``agent`` say what each does with them): agent → hub ``hello``, ``hb``,
``fail``, ``put``, ``st``, ``end`` (node 0), ``bye``; hub → agents ``hb``, ``fail``, ``got``,
``view``, ``lost``, ``end``, ``closing``.

Layering: this package imports neither ``launchers.run`` nor ``launchers.health``; both use it
(tests/test_layout.py).

A local simulation (one mlaunch for every node) uses ``LocalEvents``: the same interface,
in process, no socket and no pyzmq import. ``open_job_events`` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launchers.control.events import (
    ExchangeFailed,
    JobEnded,
    JobEvents,
    LocalEvents,
    Lost,
    RemoteFailure,
)

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


def open_job_events(job: Job, cluster: Cluster) -> JobEvents:
    """The control plane for this node: in process for one node or a simulation, else pyzmq to node 0's hub."""
    if cluster.simulated or cluster.nnodes <= 1:
        return LocalEvents()
    from launchers.control.agent import NetworkEvents
    from launchers.control.wire import job_secret

    port = control_port(job, cluster.master_port, cluster.control_port)
    secret = job_secret(job.job_name, cluster.master_addr, port, cluster.env, cluster.control_key)
    return NetworkEvents(
        node=cluster.node_rank,
        nnodes=cluster.nnodes,
        master_addr=cluster.master_addr,
        port=port,
        secret=secret,
        node_timeout=node_timeout(job),
        join_timeout=job.monitor.join_timeout,  # never shorter than node_timeout (the agent sees to it)
    )


__all__ = [
    "ExchangeFailed",
    "JobEnded",
    "JobEvents",
    "LocalEvents",
    "Lost",
    "RemoteFailure",
    "control_port",
    "node_timeout",
    "open_job_events",
]
