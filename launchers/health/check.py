"""Run the node health check across the job and decide what it means for training.

On real nodes every node's mlaunch takes part. Through the control plane (``JobEvents.exchange``)
the nodes first meet (so their compute probes run at the same moment and compare), then each
measures itself (``probes``) and its links (``network``: pairs of gloo groups on a TCPStore that
node 0 hosts at the control port + ``STORE_PORT_OFFSET``), then every node's results go to every
node. Each node applies the same rules (``verdict``) and so knows the bad hosts; node 0 prints
the table and writes ``<log_dir>/health.json``. When a node never reports, node 0 judges the
partial results (that node is faulty); the others cannot know the verdict and fail.

A local simulation measures each simulated node in turn on this machine and runs the link
rounds between threads over loopback: the figures say nothing about real nodes, but every
part of the check runs.

Exit code ``HEALTH_EXIT_CODE`` (75, EX_TEMPFAIL: "retry elsewhere"): the check found a bad
node and training did not start here (``on_failure: fail``), or this node was excluded.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launchers.health import network, probes
from launchers.health.report import document, table, write
from launchers.health.verdict import Rules, Verdict, judge
from launchers.log import say

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.platform.cluster import Cluster
    from launchers.run.control import JobEvents

HEALTH_EXIT_CODE = 75
STORE_PORT_OFFSET = 1  # the link test's TCPStore: the control plane's port + this
SHARE_MARGIN = 5.0  # seconds past the measuring deadline the results may take to gather


@dataclass
class HealthOutcome:
    verdicts: list[Verdict]
    seconds: float
    incomplete: str | None = None  # why this node could not learn every node's result
    hosts: dict[int, str] = field(default_factory=dict)

    @property
    def bad(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.bad]


def rules_of(job: Job) -> Rules:
    options = job.health_check
    return Rules(options.straggler_factor, options.memory_limit, options.min_free_gb)


def measure_local(job: Job, host: str) -> dict[str, Any]:
    """This node's own probes (no links)."""
    return {
        "host": host,
        "compute": probes.compute(),
        "memory": probes.memory(),
        "storage": probes.storage(job.resolve(job.checkpoint.dir)),
    }


def _torch_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available())


def run_health(job: Job, cluster: Cluster, events: JobEvents) -> HealthOutcome:
    """Measure every node, judge, and (node 0, or a simulation) print the table and write health.json."""
    start = time.monotonic()
    say(f"health check: measuring {cluster.nnodes} node(s) (compute, memory, storage, links)")
    outcome = _networked(job, cluster, events, start) if events.networked else _local(job, cluster, start)
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
    if cluster.nnodes > 1 and _torch_ready():
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
    store = network.open_store("127.0.0.1", port, host=True, nnodes=nnodes, timeout=5)
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
            out, _ = proc.communicate(timeout=max(seconds, 1.0) + 5)
            links[node] = json.loads(out) if proc.returncode == 0 else {}
        except (subprocess.TimeoutExpired, ValueError):
            proc.kill()
            proc.wait()
    del store
    return links


def _networked(job: Job, cluster: Cluster, events: JobEvents, start: float) -> HealthOutcome:
    """This node's part of a check across real nodes (one mlaunch per node, joined by the control plane)."""
    from launchers.run.control import ExchangeFailed, control_port

    deadline = start + job.health_check.timeout
    topic = f"health/{events.generation}"
    host = socket.gethostname()
    port = control_port(job, cluster.master_port) + STORE_PORT_OFFSET
    store = None
    torch_ready = _torch_ready()
    if torch_ready and cluster.node_rank == 0:  # hosted before the others are told to connect
        store = network.open_store(cluster.master_addr, port, host=True, nnodes=cluster.nnodes, timeout=5)
    hosts = {i: cluster.host_of(i) for i in range(cluster.nnodes)}
    try:
        hosts.update(events.exchange(f"{topic}/hello", host, deadline))
    except ExchangeFailed as exc:  # measure anyway; the results' gathering says who is missing
        say(f"health check: not every node arrived ({exc}); measuring anyway")
    result = measure_local(job, host)
    if torch_ready:
        try:
            if store is None:
                store = network.open_store(cluster.master_addr, port, host=False, nnodes=cluster.nnodes, timeout=10)
            links = network.run_links(cluster.node_rank, cluster.nnodes, store, deadline)
        except RuntimeError as exc:  # the store on node 0 cannot be reached: every link fails
            say(f"health check: link test failed: {exc}")
            links = {peer: None for peer in range(cluster.nnodes) if peer != cluster.node_rank}
        result["links"] = {str(peer): t for peer, t in links.items()}
    gathered, incomplete = _gather(events, f"{topic}/result", result, deadline + SHARE_MARGIN)
    results = {int(node): value for node, value in gathered.items()}
    verdicts = judge(results, cluster.nnodes, rules_of(job), hosts)
    del store  # node 0: every node has reported, so no pair uses it any more
    return HealthOutcome(verdicts, time.monotonic() - start, incomplete, hosts)


def _gather(events: JobEvents, topic: str, value: Any, deadline: float) -> tuple[dict[int, Any], str | None]:
    """Every node's result; on node 0, when one is missing, what did arrive (the hub holds it)."""
    from launchers.run.control import ExchangeFailed

    try:
        return events.exchange(topic, value, deadline), None
    except ExchangeFailed as exc:
        hub = getattr(events, "hub", None)  # node 0 hosts the hub: the partial gather is in this process
        partial = dict(hub.gathers.get(topic, {})) if hub is not None else {events.node: value}
        return {int(node): v for node, v in partial.items()}, str(exc)
