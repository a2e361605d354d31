"""The hub node 0's mlaunch runs (a thread with a pyzmq ROUTER socket): it watches, relays, reduces and keeps the view.

What each message means and who says it is ``messages`` (the protocol's one definition); this
thread answers the agents' messages through ``messages.handlers`` (``on_<kind>`` below). Any
message is also a sign of life: its time is what ``node_timeout`` is measured from.

Ownership: this thread alone touches the socket and the hub's state (the ``roster`` of node
statuses, the exchanges, the status entries); the membership's decisions (``membership``)
return effects (``effects``) that ``_apply`` carries out, in one place. Other threads read
only the ``HubView`` the thread publishes (``hub_view``): ``snapshot()``.

Costs: a broadcast is encoded and signed once and the same frames go to every peer; the
per-second load is the agents' messages (``cadence``: bounded in total whatever N) plus a
heartbeat or summary broadcast per interval. Exchanges finish when every current member
contributed (``gathers``), reduced by the table the hub was given (``reductions``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import zmq

from launchers.config.elastic import LAST_CALL
from launchers.control import messages as m
from launchers.control.cadence import Cadence, cadence
from launchers.control.effects import Broadcast, Drop, Effect, EndJob, Multicast, Send, VoidExchanges
from launchers.control.gathers import Done, Gathers
from launchers.control.hub_counts import Dropped, Traffic, wire_stats  # noqa: E402
from launchers.control.hub_send import Sending
from launchers.control.hub_view import HubView, Publisher
from launchers.control.membership import Membership
from launchers.control.reductions import BUILTIN, Reducers
from launchers.control.roster import IllegalTransition, NodeStatus, Roster
from launchers.control.succession import Inherited
from launchers.control.successor_hub import bind, inherit
from launchers.control.transport import MONITORED, Strangers, curve_keys, pending_limit, secure_hub
from launchers.control.wire import Incoming, Outgoing, encode, seal, unseal
from launchers.log import say

VIEW_CACHE = 0.5  # seconds an encoded whole view is reused for other nodes asking (a burst of askers)
BATCH = 2000  # messages taken in before the timers are looked at again
GONE_AGAIN = "it was left out of the job earlier"


class Hub(Sending, threading.Thread):
    def __init__(
        self,
        context: zmq.Context[Any],
        port: int,
        secret: bytes,
        nnodes: int,
        node_timeout: float,
        elastic: tuple[int, int] | None = None,
        reducers: Reducers = BUILTIN,
        last_call: float = LAST_CALL,
        host_node: int = 0,
        inherited: Inherited | None = None,
        movable: bool = False,
    ) -> None:
        """``elastic``: the node range (members leave and join: ``membership``); ``reducers``: for exchanges.

        ``last_call``: at the first start, how long the members that came wait for the others once MIN met.
        ``host_node``: the node whose mlaunch runs it; ``inherited``: a successor's start (``successor_hub``);
        ``movable``: every node can find a successor (every host is known): ``host_node`` may leave.
        """
        super().__init__(name="mlaunch-control-hub", daemon=True)
        self.secret = secret
        self.sent, self.heard = Outgoing(), Incoming()  # issue 47: the hub's stream; the agents' (replays dropped)
        self.nnodes = nnodes  # node indexes are 0 … nnodes-1
        self.node_timeout = node_timeout
        self.host_node = host_node
        self.roster = Roster(nnodes, host_node)
        self.hosts = self.roster.hosts
        self.membership = Membership(self.roster, elastic, node_timeout, last_call, host_node)
        self.membership.movable = movable and elastic is not None
        if inherited is not None:
            inherit(self.membership, inherited, time.monotonic())
        self.cadence: Cadence = cadence(len(self.roster.members), node_timeout)
        self.sock = context.socket(zmq.ROUTER)
        self.curve = curve_keys(secret)  # None: this libzmq has no CURVE (the HMAC alone keys the plane)
        secure_hub(self.sock, self.curve, nnodes)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a node that reconnects takes its identity back
        self.sock.setsockopt(zmq.BACKLOG, max(100, min(nnodes, 65536)))  # every node connecting at once
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self._unbound = bind(self.sock, f"tcp://*:{port}", late=inherited is not None)  # a successor: maybe late
        self.monitor = self.sock.get_monitor_socket(MONITORED)  # strangers counted; a member's close: ``on_close``
        self.elastic = elastic is not None
        self.strangers = Strangers(cap=pending_limit(nnodes), port=port)  # issue 47: ``shed`` over it
        self.dropped = Dropped()
        self.peers: dict[int, bytes] = {}  # node → its socket's identity
        self.gone: dict[bytes, int] = {}  # the sockets of incarnations left out → their node: told so when they speak
        self.greeted: set[bytes] | None = set() if inherited is None else None  # first start: said hello
        self.first: dict[int, m.Fail] = {}  # generation → its first failure
        self.gathers = Gathers(reducers)
        self.ended: m.End | None = None
        self.rejected = 0
        self.traffic = Traffic()
        self.status: dict[int, Any] = {}
        self._summary: m.Summary | None = None  # a new one, to broadcast
        self.summary: dict[str, Any] | None = None  # the newest, for a node that joins later
        self._view_payload: tuple[float, bytes] | None = None  # encoded once, sealed (numbered) per asker
        self._publisher = Publisher()
        self._halt = threading.Event()
        self._last_broadcast, self._now = 0.0, time.monotonic()

    # -- what node 0's mlaunch reads in process (any thread) ----------------------------------------
    def snapshot(self) -> HubView:
        """The hub's newest published view: whole, and never changed."""
        return self._publisher.view

    def view(self) -> dict[int, Any]:
        return dict(self.snapshot().status)

    def partial(self, topic: str) -> dict[int, Any]:
        """An unfinished exchange's values so far, and None for each node declared lost (none will come)."""
        return self.snapshot().gathered(topic)

    def everyone_left(self) -> bool:
        """Every other node that joined has left or is lost (an engine whose other nodes run no mlaunch: at once)."""
        return self.snapshot().everyone_left

    def wait_everyone_left(self, timeout: float) -> bool:
        return self._publisher.wait_everyone_left(timeout)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)

    # -- the thread -------------------------------------------------------------------------------
    def run(self) -> None:
        next_tick = 0.0
        try:
            while not self._halt.is_set():
                if self._unbound is not None:
                    self._unbound = bind(self.sock, self._unbound, late=True)
                if self.sock.poll(50):
                    self._receive()
                self._now = now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + min(0.5, self.cadence.heartbeat / 2)
                    self._tick(now)
                self._publish(force=False)
            self._broadcast(m.Closing())
        finally:
            self._publish(force=True)
            if self.monitor is not None:
                self.sock.disable_monitor()
                self.monitor.close(linger=0)
            self.sock.close(linger=200)

    def _publish(self, force: bool) -> None:
        self._publisher.publish(self.roster, self.gathers, self.status, self._now, force)

    def _tick(self, now: float) -> None:
        self._closed_connections(now)
        self._check_lost(now)
        self._apply(self.membership.on_tick(now))
        summary = self._summary
        if summary is not None and now - self._last_broadcast >= self.cadence.status / 2:
            self._summary = None
            self._broadcast(summary)
        if now - self._last_broadcast >= self.cadence.heartbeat:
            self._broadcast(m.Heartbeat())

    def _receive(self) -> None:
        for _ in range(BATCH):
            try:
                ident, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.traffic.messages_in += 1
            self.traffic.bytes_in += sum(len(f) for f in frames)
            self._now = time.monotonic()
            message = self._decode(frames)
            if message is not None:
                self._heard(ident, message)

    def _decode(self, frames: list[bytes]) -> m.Message | None:
        """The agent's message; None (counted when it does not verify or is malformed) when there is none to act on."""
        wire = unseal(self.secret, frames)
        if wire is None:
            self.dropped.unverified += 1
            self._reject()
            return None
        if not self.heard.fresh(frames):  # issue 47: replayed, or re-ordered behind a newer (counted in heard)
            return None
        try:
            if m.sender(wire, self.nnodes) is None:
                raise ValueError("no such node")
            message = m.decode(wire)
        except (KeyError, TypeError, ValueError):  # signed by the job's secret, but malformed
            self.dropped.malformed += 1
            self._reject()
            return None
        return message if message is not None and message.KIND in _HANDLERS else None  # the hub's own kinds: no

    def _heard(self, ident: bytes, message: Any) -> None:
        node: int = message.node
        if self.greeted is not None and not isinstance(message, m.Hello) and ident not in self.greeted:
            self._ungreeted(node)  # a first start's hub acts only on sockets that said hello
            return
        if self.greeted is not None and isinstance(message, m.Hello):
            self.greeted.add(ident)
        if ident in self.gone:
            self._to(ident, m.LeftOut(node, self.hosts.get(node, ""), Membership.out_reason(GONE_AGAIN)))
            return
        if self.roster.of(node) is NodeStatus.LOST:
            if isinstance(message, m.Hello):  # it came back too late: tell it, so it stops at once
                self._to(ident, self._lost_message(node, self._now))
            return
        if isinstance(message, m.Hello):
            self._apply(self.membership.restarted(message, self._now))
        self.peers[node] = ident
        self.roster.heard(node, self._now)
        handler = _HANDLERS.get(message.KIND)
        if handler is not None:
            try:
                handler(self, message)
            except IllegalTransition as exc:  # a bug, said loudly; the hub goes on serving the job
                say(f"control plane: node {node}'s {message.KIND!r} asked for an impossible change: {exc}")

    def _ungreeted(self, node: int) -> None:
        """A connection that speaks before its hello, at a first start's hub: a member of a job whose hub is elsewhere.

        Every mlaunch says hello first on each connection to a hub at a first start (a member that
        moves says its pending words first, but only to a successor's hub). One that does not was
        welcomed by another hub and reconnected here by itself: node 0's mlaunch started again before
        the others moved the hub away from its host. Acted on, its heartbeats would keep it from ever
        finding its hub silent, and it would wait here for a meeting this hub cannot hold; ignored, it
        moves the hub as after node 0's loss, and this node finds that hub when it starts again."""
        self.dropped.ungreeted += 1
        if self.dropped.ungreeted == 1:
            say(
                f"control plane: node {node} speaks to this hub without a hello: it is in a job whose hub is "
                "elsewhere (this node's mlaunch started again before the others moved it); not acted on"
            )

    def _reject(self) -> None:
        self.rejected += 1
        if self.rejected == 1:
            say(
                "control plane: dropped a message that does not verify (another job on this port, or a node "
                "with another job secret: MLAUNCH_JOB_SECRET, the MPI job's ssh secret)"
            )

    # -- the agents' messages (``messages.handlers``) ----------------------------------------------
    def on_hello(self, hello: m.Hello) -> None:
        self.hosts[hello.node] = hello.host
        base = self.cadence
        first = self.first[max(self.first)] if self.first else None
        welcome = m.Welcome(
            len(self.roster.members), base.heartbeat, base.status, base.hello_retry,
            first=first, ended=self.ended, summary=self.summary, hub=self.host_node,
        )  # fmt: skip
        self._apply(self.membership.on_hello(hello, welcome))

    def on_heartbeat(self, beat: m.Heartbeat) -> None:
        """Nothing but the sign of life every message is."""

    def on_status(self, status: m.Status) -> None:
        self.status[status.node] = status.entry
        self._publisher.status_changed()

    def on_fail(self, fail: m.Fail) -> None:
        if fail.generation not in self.first:
            self.first[fail.generation] = first = replace(fail, host=self.hosts.get(fail.node, ""))
            self._broadcast(first)

    def on_put(self, put: m.Put) -> None:
        if not self.membership.current(put):  # made under a membership that changed since: void
            error = "the job's membership changed since this exchange began: it is void"
            self._send(put.node, m.Got(put.topic, error=error))  # a partial step must never commit
            return
        done = self.gathers.done.get(put.topic)
        if done is not None:
            self._send(put.node, done.message(put.topic, put.node))  # said again (a rejoin): answered alone
            return
        members = self.roster.members
        done = self.gathers.put(put.topic, put.node, put.how, put.value, members)
        if done is not None:
            self._answer(put.topic, done, sorted(members))

    def on_ask(self, ask: m.Ask) -> None:
        now = self._now
        cached = self._view_payload
        if cached is None or now - cached[0] > VIEW_CACHE:
            nodes = {str(n): e for n, e in self.status.items()}
            cached = self._view_payload = (now, encode(m.View(nodes).to_wire()))
        self._send_frames(ask.node, seal(self.secret, cached[1], self.sent))

    def on_summary(self, summary: m.Summary) -> None:
        if summary.node == self.host_node and summary.summary is not None:
            self._summary, self.summary = m.Summary(summary=summary.summary), summary.summary

    def on_end(self, end: m.End) -> None:
        if end.node == self.host_node:
            self._apply([EndJob(m.End(end.node, end.exit_code, self.hosts.get(end.node, "")))])

    def on_meet(self, meet: m.Meet) -> None:
        self._apply(self.membership.on_meet(meet))

    def on_regroup(self, regroup: m.Regroup) -> None:
        if regroup.node == self.host_node:
            self._apply(self.membership.regroup(regroup.why))

    def on_ready(self, ready: m.Ready) -> None:
        self._apply(self.membership.on_ready(ready.node))

    def on_leaving(self, leaving: m.Leaving) -> None:
        self._apply(self.membership.on_leaving(leaving.node, leaving.why, self._now))

    def on_bye(self, bye: m.Bye) -> None:
        self._apply(self.membership.on_bye(bye.node, bye.exit_code, self._now))

    # -- effects: the one place a decision reaches the socket and the exchanges ---------------------
    def _apply(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if self._publisher.behind(self.roster):  # before anything is said: none learns what node 0 cannot see
                self._publish(force=False)
            if isinstance(effect, Broadcast):
                self._broadcast(effect.message)
            elif isinstance(effect, Send):
                self._send(effect.node, effect.message)
            elif isinstance(effect, Multicast):
                self._multicast(effect.nodes, effect.message)
            elif isinstance(effect, VoidExchanges):
                for topic, contributors in self.gathers.void(effect.reason):
                    self._multicast(contributors, m.Got(topic, error=effect.reason))
            elif isinstance(effect, Drop):
                self._drop(effect.node, effect.tell)
            elif isinstance(effect, EndJob) and self.ended is None:
                self.ended = effect.message
                self._broadcast(effect.message)

    def _drop(self, node: int, tell: m.Message | None) -> None:
        ident = self.peers.pop(node, None)
        self.status.pop(node, None)
        self._publisher.status_changed()
        if ident is not None and tell is not None:  # a link that came back: that mlaunch learns it is out and stops
            self.gone[ident] = node
            self._to(ident, tell)

    def _answer(self, topic: str, done: Done, nodes: Iterable[int]) -> None:
        """Each node its result: one encoding for every node that gets the shared part, one per share."""
        shared: list[bytes] | None = None
        for node in nodes:
            if node in done.shares:
                self._send(node, done.message(topic, node))
                continue
            if shared is None:
                shared = seal(self.secret, done.message(topic, node).to_wire(), self.sent)
            self._send_frames(node, shared)

    # -- liveness ---------------------------------------------------------------------------------
    def _closed_connections(self, now: float) -> None:
        """A peer's TCP connection closed (its process likely ended): silent members are judged sooner.

        Only the close of a connection that had authenticated: a stranger's closes must not shorten
        the members' fuse (``transport.Strangers`` tells them apart)."""
        if self.monitor is None:
            return
        for _ in range(BATCH):
            try:
                event = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if self.strangers.on_event(event) and self.elastic:
                self.membership.on_close(now)
        self.strangers.shed()  # issue 47: unauthenticated connections over the cap

    def wire_stats(self) -> dict[str, Any]:
        """What strangers cost the hub so far (any thread: plain ints, read whole enough for a status line)."""
        return wire_stats(self.curve is not None, self.dropped, self.strangers, self.heard.replayed)

    def _check_lost(self, now: float) -> None:
        close, short = self.membership.fuse(now, self.cadence.heartbeat)  # ``silence_limit``, said once
        timeout, roster, judged = self.membership.node_timeout, self.roster, (NodeStatus.MEMBER, NodeStatus.CANDIDATE)
        for node, seen in list(roster.seen.items()):
            if now - seen > (short if seen < close else timeout) and roster.of(node) in judged:
                self._apply(self.membership.on_silent(node, now - seen, now))

    def _lost_message(self, node: int, now: float) -> m.Lost:
        return m.Lost(node, self.hosts.get(node, ""), now - self.roster.seen.get(node, now))


_HANDLERS = m.handlers(Hub, m.AGENT)
