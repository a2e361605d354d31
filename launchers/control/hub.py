"""The hub node 0's mlaunch runs (a thread with a pyzmq ROUTER socket): it relays, gathers and watches.

- ``hello``/``hb`` from an agent: it is alive (its last message time is what ``node_timeout`` is measured from);
- ``fail``: the first failure of a generation is broadcast to every agent, later ones are not;
- ``put``: a node's value for a topic; once every node gave one, ``got`` (all values) goes to every node;
- ``end``: node 0's mlaunch ended the job with an exit code: relayed to every agent (and to
  one that joins later);
- ``bye``: the node left on purpose (not lost);
- ``st``: a node's status entry; every second the entries that changed go to every node (``view``);
- a joined node silent for ``node_timeout`` is broadcast as ``lost``; the hub says ``hb`` to
  every agent twice a second, and ``closing`` when it stops.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import zmq

from launchers.control.wire import seal, unseal
from launchers.log import say

HEARTBEAT = 0.5  # seconds between heartbeats, both ways


class Hub(threading.Thread):
    def __init__(self, context: zmq.Context[Any], port: int, secret: bytes, nnodes: int, node_timeout: float) -> None:
        super().__init__(name="mlaunch-control-hub", daemon=True)
        self.secret = secret
        self.nnodes = nnodes
        self.node_timeout = node_timeout
        self.sock = context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a node that reconnects takes its identity back
        self.sock.bind(f"tcp://*:{port}")
        self.peers: dict[int, bytes] = {}
        self.hosts: dict[int, str] = {}
        self.seen: dict[int, float] = {}
        self.left: set[int] = set()
        self.lost: set[int] = set()
        self.first: dict[int, dict[str, Any]] = {}
        self.gathers: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, Any] | None = None
        self.rejected = 0
        self.status: dict[str, Any] = {}
        self._status_changed = False
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)

    def everyone_left(self) -> bool:
        """Every other node that joined has left or is lost (an engine whose other nodes run no mlaunch: at once)."""
        return all(node in self.left or node in self.lost for node in self.seen if node != 0)

    def run(self) -> None:
        next_beat = 0.0
        try:
            while not self._halt.is_set():
                if self.sock.poll(50):
                    self._receive()
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + HEARTBEAT
                    self._broadcast({"t": "hb"})
                    self._check_lost(now)
                    self._share_status()
            self._broadcast({"t": "closing"})
        finally:
            self.sock.close(linger=200)

    def _receive(self) -> None:
        while True:
            try:
                ident, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            message = unseal(self.secret, frames)
            node = message.get("node") if message else None
            if message is None or not isinstance(node, int) or not 0 <= node < self.nnodes:
                self.rejected += 1
                if self.rejected == 1:
                    say(
                        "control plane: dropped a message that does not verify (another job on this port, or a node "
                        "with another job secret: MLAUNCH_JOB_SECRET, the MPI job's ssh secret)"
                    )
                continue
            if node in self.lost:
                continue  # declared lost: whatever it says now is too late
            self.peers[node] = ident
            self.seen[node] = time.monotonic()
            self._handle(node, message)

    def _handle(self, node: int, message: dict[str, Any]) -> None:
        kind = message["t"]
        if kind == "hello":
            self.hosts[node] = str(message.get("host", ""))
            for topic, values in self.gathers.items():  # a rejoining agent learns what it missed
                if len(values) == self.nnodes:
                    self._send(node, {"t": "got", "topic": topic, "values": values})
            if self.ended is not None:
                self._send(node, self.ended)
        elif kind == "fail":
            generation = int(message["gen"])
            if generation not in self.first:
                self.first[generation] = {**message, "host": self.hosts.get(node, "")}
                self._broadcast({**self.first[generation], "t": "fail"})
        elif kind == "put":
            values = self.gathers.setdefault(str(message["topic"]), {})
            values[str(node)] = message.get("value")
            if len(values) == self.nnodes:
                self._broadcast({"t": "got", "topic": message["topic"], "values": values})
        elif kind == "end" and node == 0 and self.ended is None:
            self.ended = {"t": "end", "node": 0, "code": int(message["code"]), "host": self.hosts.get(0, "")}
            self._broadcast(self.ended)
        elif kind == "bye":
            self.left.add(node)
        elif kind == "st":
            self.status[str(node)] = message.get("entry")
            self._status_changed = True

    def _share_status(self) -> None:
        """Every node's newest status entry to every node, when one changed (at most every heartbeat)."""
        if self._status_changed:
            self._status_changed = False
            self._broadcast({"t": "view", "nodes": self.status})

    def _check_lost(self, now: float) -> None:
        for node, seen in list(self.seen.items()):
            if node in self.left or node in self.lost or now - seen <= self.node_timeout:
                continue
            self.lost.add(node)
            self._broadcast({"t": "lost", "lost": node, "host": self.hosts.get(node, ""), "seconds": now - seen})

    def _send(self, node: int, message: dict[str, Any]) -> None:
        ident = self.peers.get(node)
        if ident is None:
            return
        with contextlib.suppress(zmq.ZMQError):  # unroutable or full (a peer whose link is down): heartbeats tell
            self.sock.send_multipart([ident, *seal(self.secret, message)], zmq.NOBLOCK)

    def _broadcast(self, message: dict[str, Any]) -> None:
        for node in list(self.peers):
            if node not in self.lost and node not in self.left:
                self._send(node, message)
