"""The hub node 0's mlaunch runs (a thread with a pyzmq ROUTER socket): it watches, relays, reduces and keeps the view.

What it does with each agent message (any message is also a sign of life: its time is what
``node_timeout`` is measured from):

- ``hello``: answers ``welcome`` (the cadence, the current generation's first failure, the
  job's end if said); a node already declared lost is told so instead;
- ``fail``: the first failure of a generation is broadcast, later ones are not;
- ``put``: a contribution to an exchange; when every member gave one, the result goes to
  each node (``gathers``, ``reductions``);
- ``st``: the node's status entry, kept here (node 0's whole view); ``sum`` (node 0): the
  job's summary, broadcast at the status cadence when it changed; ``ask``: the whole view,
  to that node alone (encoded at most once a second);
- ``end`` (node 0): the job's exit code, broadcast and told to later joiners; ``bye``: left.

Costs: a broadcast is encoded and signed once and the same frames go to every peer; the
per-second load is the agents' messages (``cadence``: bounded in total whatever N) plus a
heartbeat or summary broadcast per interval. The membership (``members``) is the hub's
state: exchanges finish when every current member contributed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq

from launchers.control.cadence import Cadence, cadence
from launchers.control.gathers import Done, Gathers
from launchers.control.membership import Membership
from launchers.control.wire import seal, unseal
from launchers.log import say

VIEW_CACHE = 0.5  # seconds an encoded whole view is reused for other nodes asking (a burst of askers)
_MORE, _LAST = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)  # plain ints: the per-peer loop is the cost
BATCH = 2000  # messages taken in before the timers are looked at again


@dataclass
class Traffic:
    """What crossed the hub's socket (the benchmark's bytes per second)."""

    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    slowest_broadcast: float = 0.0  # seconds the longest broadcast took to hand to every peer's queue
    broadcasts: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind → (began, seconds) of the last


class Hub(threading.Thread):
    def __init__(
        self,
        context: zmq.Context[Any],
        port: int,
        secret: bytes,
        nnodes: int,
        node_timeout: float,
        elastic: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(name="mlaunch-control-hub", daemon=True)
        self.secret = secret
        self.nnodes = nnodes  # node indexes are 0 … nnodes-1
        self.members: set[int] = set(range(nnodes))  # who an exchange waits for (a lost node stays until replaced)
        self.node_timeout = node_timeout
        self.cadence: Cadence = cadence(len(self.members), node_timeout)
        self.sock = context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a node that reconnects takes its identity back
        self.sock.setsockopt(zmq.BACKLOG, max(100, min(nnodes, 65536)))  # every node connecting at once
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(f"tcp://*:{port}")
        self.membership = Membership(self, elastic)  # an elastic range: members leave and join (``membership``)
        self.membership.watch(self.sock)
        self.peers: dict[int, bytes] = {}
        self.hosts: dict[int, str] = {}
        self.seen: dict[int, float] = {}
        self.left: set[int] = set()
        self.lost: set[int] = set()
        self.first: dict[int, dict[str, Any]] = {}
        self.gathers = Gathers()
        self.ended: dict[str, Any] | None = None
        self.rejected = 0
        self.traffic = Traffic()
        self.status: dict[int, Any] = {}
        self._summary: dict[str, Any] | None = None  # a new one, to broadcast
        self.summary: dict[str, Any] | None = None  # the newest, for a node that joins later
        self._view_frames: tuple[float, list[bytes]] | None = None
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._last_broadcast = 0.0

    # -- what node 0's mlaunch reads in process ---------------------------------------------------
    def view(self) -> dict[int, Any]:
        with self._lock:
            return dict(self.status)

    def partial(self, topic: str) -> dict[int, Any]:
        """An unfinished exchange's values so far, and None for each node declared lost (none will come)."""
        with self._lock:
            return {**{node: None for node in self.lost}, **self.gathers.partial(topic)}

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)

    def everyone_left(self) -> bool:
        """Every other node that joined has left or is lost (an engine whose other nodes run no mlaunch: at once)."""
        return all(node in self.left or node in self.lost for node in self.seen if node != 0)

    # -- the thread -------------------------------------------------------------------------------
    def run(self) -> None:
        next_tick = 0.0
        try:
            while not self._halt.is_set():
                if self.sock.poll(50):
                    self._receive()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + min(0.5, self.cadence.heartbeat / 2)
                    self._tick(now)
            self._broadcast({"t": "closing"})
        finally:
            self.membership.close(self.sock)
            self.sock.close(linger=200)

    def _tick(self, now: float) -> None:
        self.membership.closed_connections()
        self._check_lost(now)
        summary = self._summary
        if summary is not None and now - self._last_broadcast >= self.cadence.status / 2:
            self._summary = None
            self._broadcast({"t": "sum", "summary": summary})
        if now - self._last_broadcast >= self.cadence.heartbeat:
            self._broadcast({"t": "hb"})

    def _receive(self) -> None:
        for _ in range(BATCH):
            try:
                ident, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.traffic.messages_in += 1
            self.traffic.bytes_in += sum(len(f) for f in frames)
            message = unseal(self.secret, frames)
            node = message.get("node") if message else None
            if message is None or not isinstance(node, int) or not 0 <= node < self.nnodes:
                self._reject()
                continue
            if node in self.lost:
                if message["t"] == "hello":  # it came back too late: tell it, so it stops at once
                    self._to(ident, self._lost_message(node, time.monotonic()))
                continue
            if not self.membership.speaker(node, ident, message, time.monotonic()):
                continue
            self.peers[node] = ident
            self.seen[node] = time.monotonic()
            try:
                self._handle(node, message)
            except (KeyError, TypeError, ValueError):  # signed by the job's secret, but malformed
                self._reject()

    def _reject(self) -> None:
        self.rejected += 1
        if self.rejected == 1:
            say(
                "control plane: dropped a message that does not verify (another job on this port, or a node "
                "with another job secret: MLAUNCH_JOB_SECRET, the MPI job's ssh secret)"
            )

    def _handle(self, node: int, message: dict[str, Any]) -> None:
        kind = message["t"]
        if kind == "hello":
            self._hello(node, message)
        elif kind == "st":
            with self._lock:
                self.status[node] = message.get("entry")
        elif kind == "put":
            if self.membership.current(message):
                self._put(node, str(message["topic"]), message.get("how"), message.get("value"))
            else:  # made under a membership that changed since: void (a partial step must never commit)
                error = "the job's membership changed since this exchange began: it is void"
                self._send(node, {"t": "got", "topic": str(message["topic"]), "error": error})
        elif kind == "meet":
            self.membership.meet(node, message)
        elif kind == "fail":
            generation = int(message["gen"])
            if generation not in self.first:
                self.first[generation] = {**message, "host": self.hosts.get(node, "")}
                self._broadcast(self.first[generation])
        elif kind == "sum" and node == 0 and isinstance(message.get("summary"), dict):
            self._summary = self.summary = message["summary"]
        elif kind == "ask":
            self._send_view(node)
        elif kind == "end" and node == 0 and self.ended is None:
            self.ended = {"t": "end", "node": 0, "code": int(message["code"]), "host": self.hosts.get(0, "")}
            self._broadcast(self.ended)
        elif kind == "regroup" and node == 0:
            self.membership.regroup(str(message.get("why", "")))
        elif kind == "leaving":
            end = self.membership.on_leaving(node, str(message.get("why", "")), time.monotonic())
            if end is not None and self.ended is None:
                self.ended = end
                self._broadcast(end)
        elif kind == "bye" and not self.membership.on_bye(node, int(message.get("code", 0)), time.monotonic()):
            self.left.add(node)

    def _put(self, node: int, topic: str, how: Any, value: Any) -> None:
        with self._lock:
            done = self.gathers.done.get(topic)
            if done is not None:
                self._send(node, done.message(topic, node))  # said again (a rejoin): answered alone
                return
            done = self.gathers.put(topic, node, how, value, self.members)
        if done is not None:
            self._answer(topic, done, sorted(self.members))

    def _hello(self, node: int, message: dict[str, Any]) -> None:
        known = self.hosts.get(node)
        self.hosts[node] = str(message.get("host", ""))
        if known is not None and node in self.left:
            self.left.discard(node)
        welcome: dict[str, Any] = {"t": "welcome", "members": len(self.members), **self.cadence.as_message()}
        welcome.update(self.membership.welcome(node, time.monotonic()))
        if self.first:
            welcome["first"] = self.first[max(self.first)]
        if self.ended is not None:
            welcome["ended"] = self.ended
        if self.summary is not None:
            welcome["summary"] = self.summary
        self._send(node, welcome)

    def _answer(self, topic: str, done: Done, nodes: Iterable[int]) -> None:
        """Each node its result: one encoding for every node that gets the shared part, one per share."""
        shared: list[bytes] | None = None
        for node in nodes:
            if node in done.shares:
                self._send(node, done.message(topic, node))
                continue
            if shared is None:
                shared = seal(self.secret, done.message(topic, node))
            self._send_frames(node, shared)

    def _send_view(self, node: int) -> None:
        now = time.monotonic()
        cached = self._view_frames
        if cached is None or now - cached[0] > VIEW_CACHE:
            with self._lock:
                nodes = {str(n): e for n, e in self.status.items()}
            cached = self._view_frames = (now, seal(self.secret, {"t": "view", "nodes": nodes}))
        self._send_frames(node, cached[1])

    def _check_lost(self, now: float) -> None:
        limit = self.membership.silence_limit(now)  # shorter just after a peer's connection closed (elastic)
        for node, seen in list(self.seen.items()):
            if node in self.left or node in self.lost or now - seen <= limit:
                continue
            why = self.membership.on_silent(node, now - seen, now)  # None: left out of an elastic job
            if why is None:
                continue
            self.lost.add(node)
            self._broadcast(self._lost_message(node, now, why))

    def _lost_message(self, node: int, now: float, why: str = "") -> dict[str, Any]:
        seconds = now - self.seen.get(node, now)
        return {"t": "lost", "lost": node, "host": self.hosts.get(node, ""), "seconds": seconds, "why": why}

    # -- sending ----------------------------------------------------------------------------------
    def _send(self, node: int, message: dict[str, Any]) -> None:
        self._send_frames(node, seal(self.secret, message))

    def _multicast(self, nodes: Iterable[int], message: dict[str, Any]) -> None:
        """One encoding, the same bytes to ``nodes`` (a meeting's members, an exchange's contributors)."""
        frames = seal(self.secret, message)
        for node in nodes:
            self._send_frames(node, frames)

    def _send_frames(self, node: int, frames: list[bytes]) -> None:
        ident = self.peers.get(node)
        if ident is not None and node not in self.lost:
            self._to(ident, frames)

    def _to(self, ident: bytes, frames: list[bytes] | dict[str, Any]) -> None:
        payload = seal(self.secret, frames) if isinstance(frames, dict) else frames
        try:  # unroutable or full (a peer whose link is down, or that does not read): heartbeats tell
            self.sock.send_multipart([ident, *payload], zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        self.traffic.messages_out += 1
        self.traffic.bytes_out += sum(len(f) for f in payload)

    def _broadcast(self, message: dict[str, Any]) -> None:
        """One encoding, the same bytes to every node still in the job (the loop is the per-peer cost: keep it bare)."""
        began = self._last_broadcast = time.monotonic()
        (body,) = seal(self.secret, message)
        send, sent = self.sock.send, 0
        skip = self.left | self.lost
        for node, ident in list(self.peers.items()):
            if node not in skip:
                try:
                    send(ident, _MORE)
                    send(body, _LAST)
                    sent += 1
                except zmq.ZMQError:  # a peer that cannot take it: heartbeats tell
                    pass
        took = time.monotonic() - began
        self.traffic.messages_out += sent
        self.traffic.bytes_out += sent * len(body)
        self.traffic.slowest_broadcast = max(self.traffic.slowest_broadcast, took)
        self.traffic.broadcasts[message["t"]] = (began, took)
