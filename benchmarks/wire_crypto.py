"""What CURVE costs node 0's process: CPU seconds for N handshakes, for broadcasts and for the agents' messages.

The hub's socket as ``launchers.control.transport`` sets it up (with CURVE, and with it off), in
a process of its own; N agents' DEALER sockets in this one, all on loopback. CPU time of the
hub's process (its Python thread and libzmq's I/O thread, where the encryption runs) is what is
compared — not wall time, which the agents sharing this machine's cores would swamp. Per mode:

- **handshakes**: N agents connect at once; the hub's CPU until every one was heard;
- **broadcast**: ``--broadcasts`` messages of ``--size`` bytes to every agent (a failure, a heartbeat);
- **agents' messages**: every agent sends ``--messages`` of ``--size`` bytes (status entries).

    python benchmarks/wire_crypto.py                    # N = 1024
    python benchmarks/wire_crypto.py --nodes 4096
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq  # noqa: E402

from launchers.control.transport import curve_keys, secure_agent, secure_hub  # noqa: E402

KEY = b"wire-crypto-benchmark-key-32-byt"


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def hub(link: Connection, curve: bool, nnodes: int, broadcasts: int, messages: int, size: int) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    secure_hub(sock, curve_keys(KEY) if curve else None, nnodes)
    sock.setsockopt(zmq.BACKLOG, 65536)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    link.send(port)
    began = cpu()
    peers: set[bytes] = set()
    while len(peers) < nnodes - 1:
        ident, _ = sock.recv_multipart()
        peers.add(ident)
    handshakes = cpu() - began
    body = b"b" * size
    began = cpu()
    for _ in range(broadcasts):
        for ident in peers:
            sock.send(ident, zmq.SNDMORE)
            sock.send(body)
    link.send("sent")
    link.recv()  # every agent has them all
    broadcast = cpu() - began
    began = cpu()
    for _ in range((nnodes - 1) * messages):
        sock.recv_multipart()
    received = cpu() - began
    link.send((handshakes, broadcast, received))
    sock.close(linger=0)
    context.term()


def measure(curve: bool, nnodes: int, broadcasts: int, messages: int, size: int) -> tuple[float, float, float]:
    mine, theirs = mp.Pipe()
    process = mp.Process(target=hub, args=(theirs, curve, nnodes, broadcasts, messages, size))
    process.start()
    port = mine.recv()
    context = zmq.Context()
    context.setsockopt(zmq.MAX_SOCKETS, 1 << 17)
    keys = curve_keys(KEY) if curve else None
    agents = []
    for node in range(1, nnodes):
        sock = context.socket(zmq.DEALER)
        secure_agent(sock, keys, nnodes)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.IDENTITY, f"node-{node}".encode())
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(b"hello")
        agents.append(sock)
    assert mine.recv() == "sent"
    poller = zmq.Poller()
    for sock in agents:
        poller.register(sock, zmq.POLLIN)
    wanted, got = broadcasts * len(agents), 0
    while got < wanted:
        for sock, _ in poller.poll(1000):
            while True:
                try:
                    sock.recv(zmq.NOBLOCK)
                    got += 1
                except zmq.Again:
                    break
    mine.send("received")
    body = b"s" * size
    for _ in range(messages):
        for sock in agents:
            sock.send(body)
    result: tuple[float, float, float] = mine.recv()
    process.join()
    for sock in agents:
        sock.close(linger=0)
    context.term()
    return result


def raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--broadcasts", type=int, default=20)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--size", type=int, default=600, help="bytes per message (a status entry is ~1 KiB)")
    args: Any = parser.parse_args()
    raise_fd_limit()
    n = args.nodes - 1
    print(f"node 0's process CPU, {n} agents on loopback, {args.size}-byte messages")
    print(f"{'wire':>8} {'handshake ms':>12} {'broadcast µs/peer':>17} {'agent msg µs':>12}")
    rows: dict[bool, list[tuple[float, float, float]]] = {}
    for curve in (False, True, False, True):
        handshakes, broadcast, received = measure(curve, args.nodes, args.broadcasts, args.messages, args.size)
        row = (handshakes / n * 1e3, broadcast / (n * args.broadcasts) * 1e6, received / (n * args.messages) * 1e6)
        rows.setdefault(curve, []).append(row)
        print(f"{'CURVE' if curve else 'plain':>8} {row[0]:>12.3f} {row[1]:>17.2f} {row[2]:>12.2f}", flush=True)
    best = {curve: [min(r[i] for r in runs) for i in range(3)] for curve, runs in rows.items()}
    extra = [best[True][i] - best[False][i] for i in range(3)]
    print(
        f"CURVE adds per handshake {extra[0]:.3f} ms, per broadcast peer {extra[1]:.2f} µs, per agent message "
        f"{extra[2]:.2f} µs of node 0's CPU (the lower of two runs each)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
