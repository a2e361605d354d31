"""The health check's across-node part at 1,024 simulated nodes: arrival, link rounds, verdict (issue 24 item 7).

Every node runs the real ``launchers.health.across.run_across`` over a real ``NetworkEvents``:
node 0 in a process of its own (hosting the hub), the others as threads over shared
``Driver``s in a few processes (as ``control_scale.py`` runs them), so every exchange — the
hello (host names to node 0, each node its turn on its machine), the ready meeting, the link
rounds' later partners (paired at the hub, each node told its own), the results (to node 0
alone) and the verdicts (each node its own and the bad ones) — crosses real sockets.

What is stubbed is the probes themselves, which the goal excludes: memory, storage and
compute return at once, each pair's all-reduce "takes" 1 ms (node 3's link 50 ms, so the
verdict has a straggler to name), and every node is on a machine of its own (no compute
turns). Printed: node 0's check from start to verdict, without the compute turn's fixed
wait (``SLOT``), split into arrive / links / results+verdict; the slowest node's end; the hub
process's CPU and bytes during the check. Goal at 1,024: ≤ 15 s excluding the probes.

    python benchmarks/health_scale.py [--nodes 1024]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from control_scale import AGENT_NICENESS, KEY, raise_fd_limit  # noqa: E402

PER_PROCESS = 256  # simulated nodes (threads) per process
GOAL_S = 15.0
SLOW_NODE = 3


def stub_probes() -> None:
    """The probes answer at once (the goal excludes them); pairs "measure" 1 ms, node 3's 50 ms."""
    from launchers.health import across, network, probes

    probes.memory = lambda: {"devices": []}
    probes.storage = lambda directory: {"free_gb": 100.0, "writable": True}
    probes.compute = lambda: {"seconds_per_matmul": 0.01}
    network.open_store = lambda *args, **kwargs: None
    slow = (f"/{SLOW_NODE}-", f"-{SLOW_NODE}/")
    network.time_pair = lambda store, key, rank, deadline, ifnames=None: 0.05 if any(s in key for s in slow) else 0.001
    across.torch_ready = lambda: True
    across.boot_id = lambda: f"machine-{threading.current_thread().name}"  # every node on a machine of its own


def job_and_cluster(nnodes: int, node: int, port: int) -> tuple[Any, Any]:
    from launchers.config.job import parse_job
    from launchers.platform.cluster import Cluster

    home = Path(tempfile.gettempdir())
    job = parse_job("entry: x.py\nhealth_check: {timeout: 120s}\n", home / "job.yaml")
    cluster = Cluster("bench", False, nnodes, node, 1, "127.0.0.1", port - 1000, control_port=port)
    return job, cluster


def check(events: Any, nnodes: int, port: int, results: dict[int, Any], go: threading.Event) -> None:
    from launchers.health.across import run_across

    job, cluster = job_and_cluster(nnodes, events.node, port)
    go.wait()
    began = time.monotonic()
    outcome = run_across(job, cluster, events, began)
    results[events.node] = (began, time.monotonic(), outcome)


def nodes_main(conn: Connection, nodes: list[int], nnodes: int, port: int) -> None:
    import zmq

    from launchers.control.agent import NetworkEvents
    from launchers.control.driver import Driver

    raise_fd_limit()
    os.nice(AGENT_NICENESS)
    stub_probes()
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, len(nodes) * 4 + 64)  # a socket and its monitor pair per agent
    driver = Driver(context, KEY, name="bench-driver")
    driver.start()
    go, results = threading.Event(), {}
    threads = []
    for node in nodes:
        events = NetworkEvents(
            node=node, nnodes=nnodes, master_addr="127.0.0.1", port=port, secret=KEY,
            node_timeout=30.0, join_timeout=300.0, driver=driver, host=f"node-{node}",
        )  # fmt: skip
        threads.append(threading.Thread(target=check, args=(events, nnodes, port, results, go), name=f"n{node}"))
    for thread in threads:
        thread.start()
    conn.send("ready")
    conn.recv()
    go.set()
    for thread in threads:
        thread.join()
    conn.send({n: (b, e, len(o.verdicts), o.incomplete) for n, (b, e, o) in results.items()})
    driver.stop()


def node0_main(conn: Connection, nnodes: int, port: int) -> None:
    from launchers.control.agent import NetworkEvents
    from launchers.control.reductions import BUILTIN
    from launchers.health.network import REDUCERS

    raise_fd_limit()
    stub_probes()
    events = NetworkEvents(
        node=0, nnodes=nnodes, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=30,
        reducers={**BUILTIN, **REDUCERS},
    )  # fmt: skip
    results: dict[int, Any] = {}
    go = threading.Event()
    thread = threading.Thread(target=check, args=(events, nnodes, port, results, go), name="n0")
    thread.start()
    conn.recv()
    cpu, traffic = time.process_time(), (events.hub.traffic.bytes_in, events.hub.traffic.bytes_out)
    go.set()
    thread.join()
    began, ended, outcome = results[0]
    bad = [(v.index, v.verdict) for v in outcome.verdicts if v.bad]
    hub = events.hub.traffic
    conn.send(
        {
            "began": began,
            "ended": ended,
            "bad": bad,
            "incomplete": outcome.incomplete,
            "cpu": time.process_time() - cpu,
            "bytes": hub.bytes_in + hub.bytes_out - sum(traffic),
        }
    )
    conn.recv()  # the hub stays until every node has its verdict (as node 0's mlaunch waits for every node to leave)
    events.hub.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    args = parser.parse_args()
    raise_fd_limit()
    from launchers.health.across import SLOT
    from launchers.platform.cluster import free_port

    nnodes, port = args.nodes, free_port()
    others = list(range(1, nnodes))
    ctx = mp.get_context("fork")
    hub_link, theirs = ctx.Pipe()
    procs = [ctx.Process(target=node0_main, args=(theirs, nnodes, port), daemon=True)]
    links = []
    for i in range(0, len(others), PER_PROCESS):
        mine, theirs = ctx.Pipe()
        procs.append(ctx.Process(target=nodes_main, args=(theirs, others[i : i + PER_PROCESS], nnodes, port)))
        links.append(mine)
    for proc in procs:
        proc.start()
    try:
        for link in links:
            link.recv()
        time.sleep(2.0)  # every agent joined
        for link in [hub_link, *links]:
            link.send("go")
        node0 = hub_link.recv()
        ends = {n: v for link in links for n, v in link.recv().items()}
        hub_link.send("stop")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    report(nnodes, node0, ends, SLOT)
    return 0


def report(nnodes: int, node0: dict[str, Any], ends: dict[int, Any], slot: float) -> None:
    took = node0["ended"] - node0["began"] - slot  # the compute turn's fixed wait (one machine each) is a probe's
    slowest = max(end for _, end, _, _ in ends.values()) - node0["began"] - slot
    incomplete = sum(1 for *_, inc in ends.values() if inc)
    print(f"health check across {nnodes} simulated nodes (probes stubbed), node 0's view:")
    print(
        f"  start → verdict on node 0: {took:.2f} s excluding probes (goal ≤ {GOAL_S:g} s): "
        f"{'met' if took <= GOAL_S else 'NOT met'}"
    )
    print(f"  slowest node had its verdict {slowest:.2f} s after node 0 began; {incomplete} node(s) incomplete")
    print(f"  bad nodes named: {node0['bad']} (node {SLOW_NODE}'s links were made slow)")
    reasons = {str(inc) for *_, inc in ends.values() if inc} | (
        {str(node0["incomplete"])} if node0["incomplete"] else set()
    )
    for reason in sorted(reasons)[:3]:
        print(f"  incomplete: {reason}")
    print(
        f"  hub process during the check: {node0['cpu']:.2f} s CPU, {node0['bytes'] / 1e6:.1f} MB through its socket "
        f"({node0['bytes'] / nnodes / 1e3:.1f} kB per node)"
    )


if __name__ == "__main__":
    sys.exit(main())
