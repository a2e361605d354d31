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
    from launchers.control import JobEvents
    from launchers.platform.cluster import Cluster

STORE_PORT_OFFSET = 1  # the link test's TCPStore: the control plane's port + this
SHARE_MARGIN = 5.0  # seconds past the link rounds' budget the results may take to gather
READY_LIMIT = 10.0  # seconds the nodes wait for each other between the storage and the compute probes
IN_FLIGHT = 1.0  # seconds node 0 still takes results in after the gathering failed (sent, not yet in)
SLOT = 0.6  # seconds of one node's compute turn on a shared machine (the probe takes ~0.35 s)


def boot_id() -> str:
    """The kernel's boot id: equal for every container or namespace on one machine."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def turn(hello: dict[int, Any], node: int) -> tuple[int, int]:
    """(my turn among the nodes on my machine, the most nodes any machine has); (0, 1) without boot ids."""
    boots = {n: value.get("boot") for n, value in hello.items() if isinstance(value, dict) and value.get("boot")}
    groups: dict[str, list[int]] = {}
    for n in sorted(boots):
        groups.setdefault(str(boots[n]), []).append(n)
    most = max((len(g) for g in groups.values()), default=1)
    mine = groups.get(str(boots.get(node)), [])
    return (mine.index(node) if node in mine else 0), most


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _meet(events: JobEvents, topic: str, value: Any, deadline: float) -> dict[int, Any]:
    from launchers.control import ExchangeFailed

    try:
        return events.exchange(topic, value, deadline)
    except ExchangeFailed as exc:  # measure anyway; the results' gathering says who is missing
        say(f"health check: not every node arrived ({exc}); measuring anyway")
        return {events.node: value}


def run_across(job: Job, cluster: Cluster, events: JobEvents, start: float) -> HealthOutcome:
    from launchers.control import control_port

    deadline = start + job.health_check.timeout
    topic = f"health/{events.generation}"
    node, host = cluster.node_rank, socket.gethostname()
    port = control_port(job, cluster.master_port, cluster.control_port) + STORE_PORT_OFFSET
    use_links = torch_ready()
    store = None
    if use_links and node == 0:  # hosted before the others are told to connect
        store = network.open_store(
            cluster.master_addr, port, host=True, nnodes=cluster.nnodes, timeout=network.ROUND_BUDGET
        )
    hello = _meet(events, f"{topic}/hello", {"host": host, "boot": boot_id()}, deadline)
    hosts = {i: cluster.host_of(i) for i in range(cluster.nnodes)}
    hosts.update({int(n): str(v.get("host")) for n, v in hello.items() if isinstance(v, dict)})
    met = time.monotonic()
    result: dict[str, Any] = {"host": host, "memory": probes.memory()}
    result["storage"] = probes.storage(job.resolve(job.checkpoint.dir))
    if len(hello) == cluster.nnodes:  # after a missing node, a second wait for it would only cost time
        _meet(events, f"{topic}/ready", True, max(deadline, time.monotonic() + READY_LIMIT))
    base = time.monotonic()
    position, most = turn({int(n): v for n, v in hello.items()}, node)
    _sleep_until(base + position * SLOT)
    result["compute"] = probes.compute()
    _sleep_until(base + most * SLOT)  # every node starts the link rounds at the same moment
    probed = time.monotonic()
    if use_links:
        result["links"] = _links(cluster, store, port, probed)
    # Where the time went: importing torch and waiting for every node, the probes (turns included), the links.
    result["phases"] = {"arrive": met - start, "probes": probed - met, "links": time.monotonic() - probed}
    limit = probed + network.links_budget(cluster.nnodes) + SHARE_MARGIN
    gathered, incomplete = _gather(events, f"{topic}/result", result, limit, cluster.nnodes)
    verdicts = judge({int(n): v for n, v in gathered.items()}, cluster.nnodes, rules_of(job), hosts)
    del store  # node 0: every node has reported, so no pair uses it any more
    return HealthOutcome(verdicts, time.monotonic() - start, incomplete, hosts)


def _links(cluster: Cluster, store: Any, port: int, base: float) -> dict[str, float | None]:
    try:
        if store is None:
            store = network.open_store(
                cluster.master_addr, port, host=False, nnodes=cluster.nnodes, timeout=network.ROUND_BUDGET
            )
        links = network.run_links(cluster.node_rank, cluster.nnodes, store, base)
    except RuntimeError as exc:  # the store on node 0 cannot be reached: every link fails
        say(f"health check: link test failed: {exc}")
        links = {peer: None for peer in range(cluster.nnodes) if peer != cluster.node_rank}
    return {str(peer): t for peer, t in links.items()}


def _gather(
    events: JobEvents, topic: str, value: Any, deadline: float, nnodes: int
) -> tuple[dict[int, Any], str | None]:
    """Every node's result; on node 0, when one is missing, what did arrive by the deadline (the hub holds it).

    A lost node makes the exchange fail at once; node 0 still waits for the other nodes' results
    (they may be slower), until every node that is not lost gave one or the deadline passed.
    """
    from launchers.control import ExchangeFailed

    try:
        return events.exchange(topic, value, deadline), None
    except ExchangeFailed as exc:
        hub = getattr(events, "hub", None)  # node 0 hosts the hub: the partial gather is in this process
        if hub is None:
            return {events.node: value}, str(exc)
        end = max(deadline, time.monotonic() + IN_FLIGHT)
        while time.monotonic() < end and len(hub.gathers.get(topic, {})) + len(hub.lost) < nnodes:
            time.sleep(0.05)
        partial = {int(n): v for n, v in dict(hub.gathers.get(topic, {})).items()}
        return {**partial, events.node: value}, str(exc)
