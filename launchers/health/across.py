"""One node's part of a health check across real nodes (one mlaunch per node, joined by the control plane).

Steps, each node in step with the others through ``JobEvents.exchange``:

1. **hello**: every node has arrived (torch imported), and tells its host name and its
   kernel's boot id;
2. memory and storage probes, then **ready**;
3. compute: nodes that share a machine (the same boot id: containers or network namespaces
   on one host) take turns of ``SLOT`` seconds, so they do not measure each other; nodes on
   machines of their own all run at once;
4. the link rounds (``network``) on a TCPStore node 0 hosts at the control port + ``STORE_PORT_OFFSET``;
5. **result**: every node's measurements to node 0, which judges them; **verdict**: each node
   hears its own verdict and the bad nodes' (O(1) bytes per node, whatever the job's size).

The exchanges (named by ``launchers.control.topics.health``) are reductions at node 0's hub
(``launchers.control.reductions``): the hello gives node 0 every host name and each node its
turn on its machine; the link rounds' later partners are paired there from every node's
first-round time (each node gets its partner: ``network.REDUCERS``, handed to the hub).
A node that never arrives does not stop the others: they measure anyway, and node 0 judges
what arrived (the missing node is faulty); the others cannot know the verdict and say so.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchers.control.reductions import Reduction
from launchers.control.topics import health as health_topic
from launchers.health import network, probes
from launchers.health.outcome import HealthOutcome, rules_of, torch_ready
from launchers.health.verdict import Verdict, judge
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


HELLO = {"host": Reduction.GATHER0, "boot": Reduction.GROUP_RANK}  # node 0: every host; each node: its turn
MAX_BAD = 256  # bad nodes every node is told of (each node also learns its own verdict)


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _meet(events: JobEvents, topic: str, value: Any, deadline: float, how: Any) -> Any:
    """This node's part of the reduction; None when not every node arrived (measure anyway)."""
    from launchers.control import ExchangeFailed

    try:
        return events.reduce(topic, value, deadline, how)
    except ExchangeFailed as exc:  # measure anyway; the results' gathering says who is missing
        say(f"health check: not every node arrived ({exc}); measuring anyway")
        return None


def run_across(job: Job, cluster: Cluster, events: JobEvents, start: float) -> HealthOutcome:
    from launchers.control import control_port

    deadline = start + job.health_check.timeout
    generation = events.generation
    node, host = cluster.node_rank, socket.gethostname()
    port = control_port(job, cluster.master_port, cluster.control_port) + STORE_PORT_OFFSET
    use_links = torch_ready()
    store = None
    if use_links and node == 0:  # hosted before the others are told to connect
        store = network.open_store(
            cluster.master_addr, port, host=True, nnodes=cluster.nnodes, timeout=network.ROUND_BUDGET
        )
    hello = _meet(events, health_topic(generation, "hello"), {"host": host, "boot": boot_id()}, deadline, HELLO)
    hosts = {i: cluster.host_of(i) for i in range(cluster.nnodes)} if node == 0 else {node: host}  # node 0 judges
    hosts.update({int(n): str(h) for n, h in ((hello or {}).get("host") or {}).items()})
    met = time.monotonic()
    result: dict[str, Any] = {"host": host, "memory": probes.memory()}
    result["storage"] = probes.storage(job.resolve(job.checkpoint.dir))
    if hello is not None:  # after a missing node, a second wait for it would only cost time
        ready = max(deadline, time.monotonic() + READY_LIMIT)
        _meet(events, health_topic(generation, "ready"), True, ready, Reduction.COUNT)
    base = time.monotonic()
    turn = (hello or {}).get("boot") or {"index": 0, "most": 1}
    _sleep_until(base + int(turn["index"]) * SLOT)
    result["compute"] = probes.compute()
    _sleep_until(base + int(turn["most"]) * SLOT)  # every node starts the link rounds at the same moment
    probed = time.monotonic()
    if use_links:
        result["links"] = _links(cluster, store, port, probed, events, health_topic(generation, "partners"))
    # Where the time went: importing torch and waiting for every node, the probes (turns included), the links.
    result["phases"] = {"arrive": met - start, "probes": probed - met, "links": time.monotonic() - probed}
    limit = probed + network.links_budget(cluster.nnodes) + SHARE_MARGIN
    gathered, incomplete = _gather(events, health_topic(generation, "result"), result, limit, cluster.nnodes)
    verdicts, incomplete, unlisted = _verdicts(
        events, health_topic(generation, "verdict"), gathered, incomplete, (cluster, job, hosts), limit
    )
    del store  # node 0: every node has reported, so no pair uses it any more
    return HealthOutcome(verdicts, time.monotonic() - start, incomplete, hosts, cluster.nnodes, unlisted)


def _verdicts(
    events: JobEvents,
    topic: str,
    gathered: dict[int, Any],
    incomplete: str | None,
    where: tuple[Cluster, Job, dict[int, str]],
    deadline: float,
) -> tuple[list[Verdict], str | None, int]:
    """Node 0 judges every result and tells each node its own verdict and the bad ones (O(1) bytes per node).

    Another node that could not hand in its result, or hear the verdict, cannot know it: it says so.
    """
    from launchers.control import ExchangeFailed

    cluster, job, hosts = where
    if events.node == 0:
        verdicts = judge(gathered, cluster.nnodes, rules_of(job), hosts)
        if incomplete is None:
            bad = [_brief(v) for v in verdicts if v.bad]
            told = {"bad": bad[:MAX_BAD], "unlisted": max(0, len(bad) - MAX_BAD)}
            with contextlib.suppress(ExchangeFailed):
                decided = {"all": told, "each": {str(v.index): _brief(v) for v in verdicts}}
                events.reduce(topic, decided, deadline, Reduction.SCATTER0)
        return verdicts, incomplete, 0
    if incomplete is not None:
        return [], incomplete, 0
    try:
        told = events.reduce(topic, None, deadline, Reduction.SCATTER0)
    except ExchangeFailed as exc:
        return [], str(exc), 0
    mine = Verdict(**told["mine"], result=None)
    others = [Verdict(**v, result=None) for v in told["all"]["bad"] if v["index"] != mine.index]
    return [mine, *others], None, int(told["all"]["unlisted"])


def _brief(verdict: Verdict) -> dict[str, Any]:
    return {"index": verdict.index, "host": verdict.host, "verdict": verdict.verdict, "reason": verdict.reason}


def _links(
    cluster: Cluster, store: Any, port: int, base: float, events: JobEvents, topic: str
) -> dict[str, float | None]:
    def partners(mine: float | None, deadline: float) -> dict[str, Any]:
        """The later rounds' partners, paired by node 0's hub from every node's first-round time."""
        return dict(events.reduce(topic, mine, deadline, network.PARTNERS))

    try:
        if store is None:
            store = network.open_store(
                cluster.master_addr, port, host=False, nnodes=cluster.nnodes, timeout=network.ROUND_BUDGET
            )
        links = network.run_links(cluster.node_rank, cluster.nnodes, store, base, partners=partners)
    except RuntimeError as exc:  # the store on node 0 cannot be reached: every link fails
        say(f"health check: link test failed: {exc}")
        links = {peer: None for peer in range(cluster.nnodes) if peer != cluster.node_rank}
    return {str(peer): t for peer, t in links.items()}


def _gather(
    events: JobEvents, topic: str, value: Any, deadline: float, nnodes: int
) -> tuple[dict[int, Any], str | None]:
    """Node 0: every node's result; when one is missing, what did arrive by the deadline (the hub holds it).

    The results go to node 0 alone (it judges; the others hear their verdict). A lost node makes
    the exchange fail at once; node 0 still waits for the other nodes' results (they may be
    slower), until every node that is not lost gave one or the deadline passed.
    """
    from launchers.control import ExchangeFailed

    try:
        gathered = events.reduce(topic, value, deadline, Reduction.GATHER0) or {}
        return {int(n): v for n, v in gathered.items()}, None
    except ExchangeFailed as exc:
        if events.node != 0:
            return {events.node: value}, str(exc)
        end = max(deadline, time.monotonic() + IN_FLIGHT)
        while time.monotonic() < end and len(events.gathered(topic)) < nnodes:
            time.sleep(0.05)
        partial = {n: v for n, v in events.gathered(topic).items() if v is not None}
        return {**partial, events.node: value}, str(exc)
