"""Run the node health check: across real nodes (``across``), or on this machine for one node or a simulation.

Node 0 (or the simulation) prints the table and writes ``<log_dir>/health.json``; every node
gets the same verdicts (``verdict``) and ``gate`` decides what they mean for training.

A local simulation measures each simulated node in turn on this machine and runs the link
rounds between one process per simulated node over loopback: the figures say nothing about
real nodes, but every part of the check runs.

Exit code ``HEALTH_EXIT_CODE`` (75, EX_TEMPFAIL: "retry elsewhere"): the check found a bad
node and training did not start here (``on_failure: fail``), or this node was excluded.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from launchers.health import network
from launchers.health.across import run_across
from launchers.health.outcome import HEALTH_EXIT_CODE, HealthOutcome, measure_local, rules_of, torch_ready
from launchers.health.report import document, table, write
from launchers.health.verdict import judge
from launchers.log import say

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.control import JobEvents
    from launchers.platform.cluster import Cluster

__all__ = ["HEALTH_EXIT_CODE", "HealthOutcome", "run_health"]


def run_health(job: Job, cluster: Cluster, events: JobEvents) -> HealthOutcome:
    """Measure every node, judge, and (node 0, or a simulation) print the table and write health.json."""
    start = time.monotonic()
    say(f"health check: measuring {cluster.nnodes} node(s) (compute, memory, storage, links)")
    outcome = run_across(job, cluster, events, start) if events.networked else _local(job, cluster, start)
    if cluster.simulated or cluster.node_rank == 0:
        say("health check:\n" + table(outcome.verdicts))
        path = job.log_path / "health.json"
        write(path, document(outcome.verdicts, outcome.seconds, job.health_check.straggler_factor))
        say(f"health check took {outcome.seconds:.1f}s; results in {path}")
    return outcome


def _local(job: Job, cluster: Cluster, start: float) -> HealthOutcome:
    """One node, or a simulation of several on this machine."""
    deadline = start + job.health_check.timeout
    hosts = {i: (f"sim-node-{i}" if cluster.simulated else socket.gethostname()) for i in range(cluster.nnodes)}
    results: dict[int, dict[str, Any] | None] = {i: measure_local(job, hosts[i]) for i in range(cluster.nnodes)}
    if cluster.nnodes > 1 and torch_ready():
        links = _simulated_links(cluster.nnodes, deadline - time.monotonic())
        for node, node_result in results.items():
            assert node_result is not None
            node_result["links"] = links.get(node, {})
    verdicts = judge(results, cluster.nnodes, rules_of(job), hosts)
    return HealthOutcome(verdicts, time.monotonic() - start, hosts=hosts)


def _simulated_links(nnodes: int, seconds: float) -> dict[int, dict[str, float | None]]:
    """Each simulated node's link rounds in its own process over loopback (a TCPStore hosted here)."""
    import json
    import subprocess
    import sys

    from launchers.platform.cluster import free_port

    port = free_port()
    store = network.open_store("127.0.0.1", port, host=True, nnodes=nnodes, timeout=network.ROUND_BUDGET)
    argv = [sys.executable, "-m", "launchers.health.network"]
    procs = [
        subprocess.Popen(
            [*argv, str(node), str(nnodes), str(port), f"{seconds:.1f}"], stdout=subprocess.PIPE, text=True
        )
        for node in range(nnodes)
    ]
    links: dict[int, dict[str, float | None]] = {}
    for node, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(seconds, 1.0) + network.links_budget(nnodes) + 5)
            links[node] = json.loads(out) if proc.returncode == 0 else {}
        except (subprocess.TimeoutExpired, ValueError):
            proc.kill()
            proc.wait()
    del store
    return links
