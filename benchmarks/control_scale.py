"""The control plane at 64, 512 and 4,096 nodes: the real hub and N real agents over real sockets on this machine.

Node 0 is a real ``NetworkEvents`` in a process of its own (it hosts the hub, as node 0's
mlaunch does). Nodes 1…N-1 are real ``NetworkEvents`` too — the same ``AgentState`` protocol,
``wire`` seal/unseal and a DEALER socket and TCP connection each — multiplexed on one
``Driver`` thread per process, up to ``PER_PROCESS`` agents a process. Per N it measures:

- **join**: the agents start first and wait; node 0 starts a second later (a hub slow to
  start); the time from node 0's start until every agent was welcomed;
- **failure**: node N-1 reports a rank's failure; the time until each agent heard it
  (median, max; every process stamps the moment its driver handed the message to the agent);
- **meeting**: every node contributes to the restart meeting (``count``); from the first
  contribution to the last node's answer;
- **steady state**: every node publishes an 8-rank status entry every second (as the
  observer does) for a while; the hub process's CPU share (one core = 100 %) and the bytes
  per second through the hub's socket, in total and per agent;
- **hub loss** (``control_scale_succession``): node 0's process SIGKILLed; the time until every
  survivor is welcomed by node 1's new hub and the next meeting is done. Node 1 runs in a process
  of its own with its own driver (its mlaunch starts the successor's hub), at normal priority.

Beside it, the protocol before issue 24 for the same N, computed from one real ``wire.seal``
of the whole view measured in this run: it relayed every node's entry to every node twice
a second, sealing per peer (2 × N seals of an N-entry view per second).

Goals at 4,096: failure to every agent ≤ 100 ms (max), meeting ≤ 0.5 s, hub CPU ≤ 10 %,
bytes per second per agent flat in N. The agents share this machine's cores (thousands on
2), so the agent side of each latency is far slower than on real nodes; their processes run
at a lower priority (nice 10), since on a real job node 0's machine does not run them.
Figures taken while other work runs are noisy.

    python benchmarks/control_scale.py                 # N = 64, 512, 4096
    python benchmarks/control_scale.py --nodes 1024 --steady 8
    python benchmarks/control_scale.py --nodes 4096 --curve both   # each N with CURVE, then without (same run)

``--curve off`` runs the plane as a libzmq without CURVE would (``transport.has_curve`` patched
off in every process: the HMAC and the numbering alone); ``both`` measures what the encryption
costs the join and the latencies, beside the same N without it.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import control_scale_succession as succession  # noqa: E402
from benchmarks.control_scale_hosts import Hosts, enter, two_hosts  # noqa: E402
from benchmarks.control_scale_steady import node_entry, publish_for, steady  # noqa: E402

PER_PROCESS = 1024  # agents driven by one process (one poller, one driver thread)
AGENT_NICENESS = 10  # the agents' processes yield the CPU to node 0's (the hub's machine is not theirs)
KEY = b"control-scale-benchmark-secret!!"
NODE_TIMEOUT = 30.0  # monitor.node_timeout's default
GOALS = {"failure_max_ms": 100.0, "meeting_s": 0.5, "hub_cpu": 0.10}


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, target) if os.geteuid() == 0 else (target, hard))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the agents' processes ------------------------------------------------------------------------
def agents_main(conn: Connection, nodes: list[int], nnodes: int, port: int, where: Hosts | None) -> None:
    """Many agents on one driver; node 1 alone (``nodes == [1]``) is a node's mlaunch: its own driver, not niced."""
    import zmq

    from launchers.control import agent_core
    from launchers.control.agent import NetworkEvents
    from launchers.control.driver import Driver
    from launchers.log import say

    enter(where.others if where else None)
    raise_fd_limit()
    master = where.node0_ip if where else "127.0.0.1"
    driver = None
    if nodes != [1]:  # node 1 may host the hub next: its machine is the hub's
        os.nice(AGENT_NICENESS)  # they stand in for other machines: the hub's machine does not share its cores
        context = zmq.Context()
        context.set(zmq.MAX_SOCKETS, len(nodes) * 4 + 64)  # a socket and its monitor pair per agent
        driver = Driver(context, KEY, name="bench-driver")
        driver.start()
    heard: dict[int, float] = {}
    agents = []
    for node in nodes:
        events = NetworkEvents(
            node=node, nnodes=nnodes, master_addr=master, port=port, secret=KEY, node_timeout=NODE_TIMEOUT,
            join_timeout=300.0, driver=driver, host=f"node-{node}", elastic=succession.span(nnodes),
            hosts=succession.hosts(nnodes, master),
        )  # fmt: skip
        events.state.wake = stamper(heard, node)  # a failure arrived
        events.state.mover = events._move_hub  # a shared driver's agents get none: they follow the hub as a node's
        agents.append(events)
    if driver is not None:  # each real node says it once; thousands of the same line would bury the figures
        agent_core.say = lambda line, **kw: None if " joins node " in line else say(line, **kw)
    conn.send("ready")
    serve(conn, agents, heard)
    for events in agents if driver is None else ():
        events.close(0)
    if driver is not None:
        driver.stop()
        driver.context.term()


def serve(conn: Connection, agents: list[Any], heard: dict[int, float]) -> None:
    """Answer the conductor's commands until ``stop``."""
    moved: dict[int, list[float]] = {}
    while True:
        command, arg = conn.recv()
        if command == "stop":
            return
        if command == "joined":
            conn.send(wait_all(lambda e: e.state.welcomed, agents, arg))
        elif command == "fail":
            for events in agents:
                if events.node == arg:
                    began = time.monotonic()
                    events.report_failure(_Failure())
                    conn.send(began)
        elif command == "heard":
            wait_all(lambda e: e.node in heard, agents, 20.0)
            conn.send(dict(heard))
        elif command == "meet":
            conn.send(meet(agents, arg))
        elif command == "steady":
            publish_for(agents, arg)
            conn.send("done")
        elif command == "arm":
            succession.arm(agents, moved)
            conn.send(time.process_time())
        elif command == "lose":
            stamps, cpu = succession.watch(agents, moved, arg), time.process_time() - arg[1]
            hubs = [e.hub for e in agents if e.hub is not None]  # node 1's process: the successor's hub
            time.sleep(1.0 if hubs else 0.0)  # its monitor's events counted
            conn.send((stamps, sum(h.strangers.authenticated for h in hubs), cpu, bool(hubs)))


def stamper(heard: dict[int, float], node: int) -> Callable[[], None]:
    """An agent's wake-up: the first one (the failure's arrival) stamped."""

    def stamp() -> None:
        heard.setdefault(node, time.monotonic())

    return stamp


class _Failure:
    label, rank, exit_code, signal, cause = "rank 7", 7, 137, 9, ""


def wait_all(done: Any, agents: list[Any], timeout: float, every: float = 0.02) -> float:
    """The moment the last agent satisfied ``done`` (looked at every ``every`` seconds), or -1 after ``timeout``."""
    end = time.monotonic() + timeout
    left = list(agents)
    while left and time.monotonic() < end:
        left = [a for a in left if not done(a)]
        if left:
            time.sleep(every)
    return time.monotonic() if not left else -1.0


def meet(agents: list[Any], topic: str) -> tuple[float, float]:
    began = time.monotonic()
    for events in agents:
        events.state.contribute(topic, None, "count")
        events.driver.kick(events.state)
    last = wait_all(lambda e: topic in e.state.results, agents, 20.0, every=0.002)
    return began, last


# -- node 0's process -------------------------------------------------------------------------------
def node0_main(conn: Connection, nnodes: int, port: int, where: Hosts | None) -> None:
    from launchers.control.agent import NetworkEvents
    from launchers.control.messages import Fail

    enter(where.node0 if where else None)
    raise_fd_limit()
    started = time.monotonic()
    events = NetworkEvents(
        node=0, nnodes=nnodes, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=NODE_TIMEOUT,
        elastic=succession.span(nnodes), hosts=succession.hosts(nnodes, where.node0_ip if where else "127.0.0.1"),
    )  # fmt: skip
    heard: dict[int, float] = {}
    events.state.wake = stamper(heard, 0)
    hub = events.hub
    assert hub is not None
    conn.send(started)
    while True:
        command, arg = conn.recv()
        if command == "stop":
            break
        if command == "heard":
            fail = Fail.KIND
            wait_all(lambda e, f=fail: 0 in heard and f in hub.traffic.broadcasts, [events], 20.0)  # node 0 may hear
            conn.send({**heard, "broadcast": hub.traffic.broadcasts.get(fail, (float("nan"), float("nan")))})
        elif command == "meet":
            conn.send(meet([events], arg))
        elif command == "steady":
            conn.send(steady(events, arg))
    hub.stop()


# -- the conductor --------------------------------------------------------------------------------
def run(nnodes: int, seconds: float) -> dict[str, Any]:
    """Node 0 on a machine of its own (a network namespace: ``control_scale_hosts``) where it can be."""
    with two_hosts() as where:
        return run_on(nnodes, seconds, where)


def run_on(nnodes: int, seconds: float, where: Hosts | None) -> dict[str, Any]:
    from launchers.platform.cluster import free_port

    port = free_port()
    others = list(range(2, nnodes))
    groups = [[1], *(others[i : i + PER_PROCESS] for i in range(0, len(others), PER_PROCESS))]
    ctx = mp.get_context("fork")
    links, procs = [], []
    for group in groups:
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=agents_main, args=(theirs, group, nnodes, port, where), daemon=True)
        proc.start()
        links.append(mine)
        procs.append(proc)
    try:
        for link in links:
            link.recv()  # every agent is saying hello to a hub that is not there yet
        time.sleep(1.0)
        hub_link, theirs = ctx.Pipe()
        hub_proc = ctx.Process(target=node0_main, args=(theirs, nnodes, port, where), daemon=True)
        hub_proc.start()
        procs.append(hub_proc)
        started = hub_link.recv()
        result = measure(nnodes, links, hub_link, started, seconds)
        return {**result, **(lose_node0(nnodes, links, hub_proc) if where else {})}
    finally:
        for link in [*links, *([hub_link] if "hub_link" in locals() else [])]:
            with contextlib.suppress(OSError):
                link.send(("stop", None))
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def measure(nnodes: int, links: list[Any], hub_link: Any, started: float, seconds: float) -> dict[str, Any]:
    everyone = [*links, hub_link]
    for link in links:
        link.send(("joined", 120.0))
    joined = [link.recv() for link in links]
    result: dict[str, Any] = {"join": (max(joined) - started) if min(joined, default=0) >= 0 else float("nan")}
    time.sleep(1.0)
    links[-1].send(("fail", nnodes - 1))
    sent = links[-1].recv()
    for link in everyone:
        link.send(("heard", None))
    answers = {node: t for link in everyone for node, t in link.recv().items()}
    began, took = answers.pop("broadcast")
    result["uplink"], result["fanout"] = began - sent, took
    heard = {node: t - sent for node, t in answers.items()}
    latencies = sorted(heard.values())
    result["fail_median"], result["fail_max"] = statistics.median(latencies), latencies[-1]
    result["fail_heard"] = len(latencies)
    if len(latencies) < nnodes:
        print(f"  warning: {nnodes - len(latencies)} of {nnodes} nodes never heard the failure", flush=True)
    for link in everyone:
        link.send(("meet", "start/1"))
    spans = [link.recv() for link in everyone]
    result["meeting"] = max(last for _, last in spans) - min(began for began, _ in spans)
    for link in everyone:
        link.send(("steady", seconds))
    hub = hub_link.recv()
    for link in links:
        link.recv()
    result.update(hub)
    result["per_agent"] = (hub["bytes_in"] + hub["bytes_out"]) / max(1, nnodes - 1)
    return result


def lose_node0(nnodes: int, links: list[Any], hub_proc: Any) -> dict[str, Any]:
    """Node 0's process SIGKILLed (a lost machine): node 1 hosts the hub next (``control_scale_succession``)."""
    for link in links:
        link.send(("arm", None))
    marks = [link.recv() for link in links]  # each process's CPU time
    time.sleep(1.0)
    killed = time.monotonic()
    hub_proc.kill()
    for link, mark in zip(links, marks, strict=True):
        link.send(("lose", (60.0 + NODE_TIMEOUT, mark)))
    answers = [link.recv() for link in links]
    result = succession.measure(killed, [a[0] for a in answers], nnodes)
    result["loss_handshakes"] = sum(a[1] for a in answers)
    result["successor_cpu"] = sum(a[2] for a in answers if a[3])
    result["agents_cpu"] = sum(a[2] for a in answers if not a[3]) / max(1, nnodes - 2)  # per agent
    return result


def old_protocol(nnodes: int) -> tuple[float, float]:
    """(hub CPU seconds per second, bytes per second) of relaying the whole view to every node twice a second."""
    from launchers.control.messages import View
    from launchers.control.wire import seal

    view = View({str(n): node_entry(n, 100) for n in range(nnodes)}).to_wire()
    times = []
    for _ in range(3):
        began = time.perf_counter()
        frames = seal(KEY, view)
        times.append(time.perf_counter() - began)
    size = sum(len(f) for f in frames)
    return 2 * nnodes * min(times), 2 * nnodes * size


def run_with(curve: bool, nnodes: int, seconds: float) -> dict[str, Any]:
    """``run`` with CURVE, or as a libzmq without it would run (the processes fork: they inherit the patch)."""
    from launchers.control import transport

    has_curve = transport.has_curve
    if not curve:
        transport.has_curve = lambda: False
    try:
        return {**run(nnodes, seconds), "curve": curve}
    finally:
        transport.has_curve = has_curve


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,512,4096", help="node counts, comma-separated")
    parser.add_argument("--steady", type=float, default=0.0, help="seconds of steady state (default: 3 status rounds)")
    parser.add_argument("--curve", choices=("on", "off", "both"), default="on", help="CURVE on the plane (default on)")
    args = parser.parse_args()
    raise_fd_limit()
    sizes = [int(n) for n in args.nodes.split(",")]
    print(f"hub + N agents over loopback TCP, {os.cpu_count()} cores; agents {PER_PROCESS} per process")
    head = (
        f"{'curve':>5} {'nodes':>6} {'join s':>7} {'fail med ms':>11} {'fail max ms':>11} {'meeting s':>9} "
        f"{'hub CPU':>8} {'hub B/s':>10} {'B/s/agent':>9} {'status s':>8} | "
        f"{'old CPU':>8} {'old B/s':>10} {'old B/s/agent':>13}"
    )
    print(head)
    rows = []
    for nnodes in sizes:
        from launchers.control.cadence import cadence

        seconds = args.steady or max(6.0, 3 * cadence(nnodes, NODE_TIMEOUT).status + 2)
        for curve in {"on": ["on"], "off": ["off"], "both": ["on", "off"]}[args.curve]:
            r = run_with(curve == "on", nnodes, seconds)
            old_cpu, old_bytes = old_protocol(nnodes)
            rows.append((nnodes, r))
            print(
                f"{curve:>5} {nnodes:>6} {r['join']:>7.2f} {r['fail_median'] * 1e3:>11.1f} "
                f"{r['fail_max'] * 1e3:>11.1f} {r['meeting']:>9.3f} {r['cpu']:>7.1%} "
                f"{r['bytes_in'] + r['bytes_out']:>10.3g} {r['per_agent']:>9.0f} "
                f"{r['status_every']:>8.2f} | {old_cpu:>7.0%} {old_bytes:>10.3g} {old_bytes / nnodes:>13.3g}",
                flush=True,
            )
    verdict([row for row in rows if args.curve != "both" or row[1]["curve"]])
    for nnodes, r in rows:  # node 0's loss, every row (with CURVE and without)
        if "loss_met" in r:
            succession.report(nnodes, r)
    return 0


def verdict(rows: list[tuple[int, dict[str, Any]]]) -> None:
    nnodes, top = rows[-1]
    checks = [
        ("failure to every agent (max)", top["fail_max"] * 1e3, GOALS["failure_max_ms"], "ms"),
        ("restart meeting", top["meeting"], GOALS["meeting_s"], "s"),
        ("hub CPU (share of one core)", top["cpu"], GOALS["hub_cpu"], ""),
    ]
    print(f"goals at N = {nnodes}:")
    print(f"  (node 0's process: {top['cpu']:.1%} of a core, of which the hub's thread {top['hub_thread']:.1%})")
    print(f"  handshakes at node 0: {top['handshakes']} completed, {top['handshakes_failed']} failed (cut and redone)")
    for name, value, goal, unit in checks:
        print(f"  {name}: {value:.3g}{unit} (goal ≤ {goal:g}{unit}) {'met' if value <= goal else 'NOT met'}")
    first = rows[0][1]["per_agent"]
    print(
        f"  bytes/s per agent: {rows[0][1]['per_agent']:.0f} at N={rows[0][0]} → {top['per_agent']:.0f} at N={nnodes} "
        f"({top['per_agent'] / first:.2f}x; goal: flat in N) {'met' if top['per_agent'] <= first * 1.2 else 'NOT met'}"
    )
    print(
        f"  the failure at N={nnodes}: at the hub after {top['uplink'] * 1e3:.1f} ms, handed to every peer's queue "
        f"in {top['fanout'] * 1e3:.1f} ms (slowest broadcast of the run: {top['slowest_broadcast'] * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    sys.exit(main())
