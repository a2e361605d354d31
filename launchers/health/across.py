"""One node's part of a health check across real nodes (one mlaunch per node, joined by the control plane).

Steps, each node in step with the others through ``JobEvents.exchange``:

1. **hello**: every node has arrived (torch imported), and tells its host name and its
   kernel's boot id;
2. memory and storage probes, then **ready**;
3. compute: nodes that share a machine (the same boot id: containers or network namespaces
   on one host) take turns of ``SLOT`` seconds, so they do not measure each other; nodes on
   machines of their own all run at once;
4. the link rounds (``network``) on a TCPStore node 0 hosts at the control port + ``STORE_PORT_OFFSET``;
5. **result**: every node's measurements to every node; each judges them the same way.

A node that never arrives does not stop the others: they measure anyway, and node 0 judges
what arrived (the missing node is faulty); the others cannot know the verdict and say so.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchers.health import network, probes
from launchers.health.outcome import HealthOutcome, rules_of, torch_ready
from launchers.health.verdict import judge
from launchers.log import say

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.platform.cluster import Cluster
    from launchers.run.control import JobEvents

STORE_PORT_OFFSET = 1  # the link test's TCPStore: the control plane's port + this
SHARE_MARGIN = 5.0  # seconds past the measuring deadline the results may take to gather
SLOT = 0.6  # seconds of one node's compute turn on a shared machine (the probe takes ~0.35 s)


def boot_id() -> str:
    """The kernel's boot id: equal for every container or namespace on one machine."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def turn(hello: dict[int, Any], node: int) -> tuple[int, int]:
    """(my position, how many) among the nodes that share my machine; (0, 1) on a machine of my own."""
    mine = (hello.get(node) or {}).get("boot")
    if not mine:
        return 0, 1
    sharing = sorted(n for n, value in hello.items() if isinstance(value, dict) and value.get("boot") == mine)
    return (sharing.index(node), len(sharing)) if node in sharing else (0, 1)


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _meet(events: JobEvents, topic: str, value: Any, deadline: float) -> dict[int, Any]:
    from launchers.run.control import ExchangeFailed

    try:
        return events.exchange(topic, value, deadline)
    except ExchangeFailed as exc:  # measure anyway; the results' gathering says who is missing
        say(f"health check: not every node arrived ({exc}); measuring anyway")
        return {events.node: value}


def run_across(job: Job, cluster: Cluster, events: JobEvents, start: float) -> HealthOutcome:
    from launchers.run.control import control_port

    deadline = start + job.health_check.timeout
    topic = f"health/{events.generation}"
    node, host = cluster.node_rank, socket.gethostname()
    port = control_port(job, cluster.master_port) + STORE_PORT_OFFSET
    use_links = torch_ready()
    store = None
    if use_links and node == 0:  # hosted before the others are told to connect
        store = network.open_store(cluster.master_addr, port, host=True, nnodes=cluster.nnodes, timeout=5)
    hello = _meet(events, f"{topic}/hello", {"host": host, "boot": boot_id()}, deadline)
    hosts = {i: cluster.host_of(i) for i in range(cluster.nnodes)}
    hosts.update({int(n): str(v.get("host")) for n, v in hello.items() if isinstance(v, dict)})
    met = time.monotonic()
    result: dict[str, Any] = {"host": host, "memory": probes.memory()}
    result["storage"] = probes.storage(job.resolve(job.checkpoint.dir))
    _meet(events, f"{topic}/ready", True, deadline)
    base = time.monotonic()
    position, sharing = turn({int(n): v for n, v in hello.items()}, node)
    _sleep_until(base + position * SLOT)
    result["compute"] = probes.compute()
    _sleep_until(base + sharing * SLOT)
    probed = time.monotonic()
    if use_links:
        result["links"] = _links(cluster, store, port, deadline)
    # Where the time went: importing torch and waiting for every node, the probes (turns included), the links.
    result["phases"] = {"arrive": met - start, "probes": probed - met, "links": time.monotonic() - probed}
    gathered, incomplete = _gather(events, f"{topic}/result", result, deadline + SHARE_MARGIN)
    verdicts = judge({int(n): v for n, v in gathered.items()}, cluster.nnodes, rules_of(job), hosts)
    del store  # node 0: every node has reported, so no pair uses it any more
    return HealthOutcome(verdicts, time.monotonic() - start, incomplete, hosts)


def _links(cluster: Cluster, store: Any, port: int, deadline: float) -> dict[str, float | None]:
    try:
        if store is None:
            store = network.open_store(cluster.master_addr, port, host=False, nnodes=cluster.nnodes, timeout=10)
        links = network.run_links(cluster.node_rank, cluster.nnodes, store, deadline)
    except RuntimeError as exc:  # the store on node 0 cannot be reached: every link fails
        say(f"health check: link test failed: {exc}")
        links = {peer: None for peer in range(cluster.nnodes) if peer != cluster.node_rank}
    return {str(peer): t for peer, t in links.items()}


def _gather(events: JobEvents, topic: str, value: Any, deadline: float) -> tuple[dict[int, Any], str | None]:
    """Every node's result; on node 0, when one is missing, what did arrive (the hub holds it)."""
    from launchers.run.control import ExchangeFailed

    try:
        return events.exchange(topic, value, deadline), None
    except ExchangeFailed as exc:
        hub = getattr(events, "hub", None)  # node 0 hosts the hub: the partial gather is in this process
        partial = dict(hub.gathers.get(topic, {})) if hub is not None else {events.node: value}
        return {int(n): v for n, v in partial.items()}, str(exc)
