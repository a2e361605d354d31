"""One agent's side of the protocol apart from its thread and socket: what it says when, what the hub's words mean.

A ``driver.Driver`` thread gives it a DEALER socket and runs ``receive`` / ``flush``: one
agent for a node's mlaunch (``NetworkEvents``), thousands from one poller per process for
the control-plane benchmark. Both run this code, so the benchmark measures what a node does.

Reliability: the DEALER socket queues nothing for a hub it is not connected to (ZMQ
``IMMEDIATE``), so a hub that starts late receives no backlog of stale heartbeats; ``hello``
is said again every ``hello_retry`` until ``welcome`` comes. What must arrive (a failure
report, a contribution to an exchange, the job's end, a farewell) is kept in the outbox
until the socket takes it, and failure reports and contributions not yet answered are said
again after every ``welcome`` (a rejoin); the hub takes a repeated one once.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import zmq

from launchers.control.cadence import Cadence, cadence
from launchers.control.events import (
    ExchangeFailed,
    JobEnded,
    JobEvent,
    Left,
    Lost,
    Meeting,
    Regroup,
    RemoteFailure,
)
from launchers.control.wire import seal, unseal

RELIABLE = frozenset(
    {"fail", "put", "end", "bye", "sum", "ask", "meet", "regroup", "leaving"}
)  # kept until sent; the rest is said again anyway
VIEW_FRESH = 1.5  # seconds a whole view asked of node 0 stays in this node's status view (then it is stale)
KEEP_RESULTS = 256  # exchange results kept (a topic is asked once; a repeat answer must not grow memory)


class AgentState:
    def __init__(
        self,
        node: int,
        nnodes: int,
        node_timeout: float,
        join_timeout: float,
        host: str,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.node = node
        self.nnodes = nnodes
        self.host = host
        self.node_timeout = node_timeout
        self.join_timeout = max(node_timeout, join_timeout)
        self.cadence: Cadence = cadence(nnodes, node_timeout)
        self.incarnation = secrets.token_hex(4)
        self.cond = threading.Condition()
        self.wake = wake  # something arrived that the supervisor's loop acts on
        self.generation = 0
        self.first: dict[int, RemoteFailure] = {}
        self.events: list[JobEvent] = []
        self.results: OrderedDict[str, tuple[Any, str | None]] = OrderedDict()
        self.lost: Lost | None = None
        self.ended: JobEnded | None = None
        self.hub_closing = False
        self.summary: dict[str, Any] = {}
        self.view: dict[int, dict[str, Any]] = {}
        self.view_at = 0.0
        self.epoch = 0  # the membership this node's contributions belong to (an elastic job: the last meeting's)
        self.candidate = False  # an elastic job that runs without this node: it waits to be admitted
        self.meetings: OrderedDict[str, Meeting] = OrderedDict()
        self.admitted: Meeting | None = None  # a candidate's admission
        self._outbox: deque[dict[str, Any]] = deque()
        self._pending: dict[str, dict[str, Any]] = {}  # topic → contribution not answered yet
        self._unconfirmed: dict[int, dict[str, Any]] = {}  # generation → failure report not yet echoed
        self._entry: dict[str, Any] | None = None  # the newest status entry not sent yet
        now = time.monotonic()
        self.started = self.heard = now
        self.welcomed = False
        self._last_sent = -1e9
        self._next_hello = now
        self._entry_sent = -1e9
        self._asked = -1e9

    # -- what the node's side hands in (any thread) ---------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        with self.cond:
            self._outbox.append(message)

    def report_failure(self, fields: dict[str, Any]) -> None:
        message = {"t": "fail", "gen": self.generation, **fields}
        with self.cond:
            self._unconfirmed[self.generation] = message
            self._outbox.append(message)

    def contribute(self, topic: str, value: Any, how: Any) -> None:
        message = {"t": "put", "topic": topic, "value": value, "how": how, "epoch": self.epoch}
        with self.cond:
            self.results.pop(topic, None)
            self._pending[topic] = message
            self._outbox.append(message)

    def publish(self, entry: dict[str, Any]) -> None:
        with self.cond:
            self._entry = entry
            self.view[self.node] = entry

    def ask_view(self, now: float) -> None:
        with self.cond:
            if now - self._asked >= 1.0:  # a watching `mlaunch status` asks every second at most
                self._asked = now
                self._outbox.append({"t": "ask"})

    def result(self, topic: str, deadline: float) -> Any:
        """The hub's answer to this node's contribution, waiting until ``deadline``; else ExchangeFailed."""
        with self.cond:
            while topic not in self.results:
                if self.lost is not None:
                    raise ExchangeFailed(self.lost.describe())
                if self.ended is not None:
                    raise ExchangeFailed(self.ended.describe())
                if time.monotonic() >= deadline:
                    raise ExchangeFailed(f"not every node answered {topic.split('/')[0]!r} in time")
                self.cond.wait(max(0.0, deadline - time.monotonic()))  # an answer, a loss or the end notifies
            value, error = self.results[topic]
        if error is not None:
            raise ExchangeFailed(f"{topic.split('/')[0]!r}: {error}")
        return value

    def meet(self, key: str, said: dict[str, Any]) -> None:
        """This node's part of an elastic job's meeting (said again after a rejoin until answered)."""
        message = {"t": "meet", "key": key, **said}
        with self.cond:
            self._pending[f"meet:{key}"] = message
            self._outbox.append(message)

    def flush_status(self) -> None:
        """Send the newest status entry now (leaving: node 0 keeps the last word of every node)."""
        with self.cond:
            self._entry_sent = -1e9

    # -- what the driver does (the socket's thread) ---------------------------------------------
    def due(self, now: float) -> list[dict[str, Any]]:
        """The messages to send now, each naming this node."""
        out: list[dict[str, Any]] = []
        with self.cond:
            while self._outbox:
                out.append(self._outbox.popleft())
            if not self.welcomed and now >= self._next_hello:
                self._next_hello = now + self.cadence.hello_retry
                out.append({"t": "hello", "host": self.host, "inc": self.incarnation, "gen": self.generation})
            if self.welcomed and self._entry is not None and now - self._entry_sent >= self.cadence.status:
                self._entry_sent = now
                out.append({"t": "st", "entry": self._entry})
                self._entry = None
            if self.welcomed and not out and now - self._last_sent >= self.cadence.heartbeat:
                out.append({"t": "hb"})
            if out:
                self._last_sent = now
        for message in out:
            message["node"] = self.node
        return out

    def unsent(self, messages: list[dict[str, Any]]) -> None:
        """The socket did not take ``messages``: keep what must arrive for the next round, in order."""
        with self.cond:
            self._outbox.extendleft(reversed([m for m in messages if m["t"] in RELIABLE]))
            if any(m["t"] == "hello" for m in messages):
                self._next_hello = 0.0  # not connected yet: say it as soon as the connection is up

    def check(self, now: float) -> None:
        """Declare the hub lost after ``node_timeout`` of silence (``join_timeout`` before it first answered)."""
        silent = now - self.heard
        limit = self.node_timeout if self.welcomed else self.join_timeout
        if silent > limit and not self.hub_closing and self.lost is None and self.ended is None:
            what = "the master, hosting the control plane" + (
                "" if self.welcomed else "; it never answered: not started, unreachable, or another job secret"
            )
            self.final(Lost(0, what, silent))

    def on_message(self, message: dict[str, Any], now: float) -> None:
        self.heard = now
        kind = message["t"]
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, message)

    # -- the hub's words -------------------------------------------------------------------------
    def _welcome(self, message: dict[str, Any]) -> None:
        with self.cond:
            self.welcomed = True
            self.candidate = self.candidate or bool(message.get("candidate"))
            self.cond.notify_all()
            self.cadence = Cadence.from_message(message, self.cadence)
            self._outbox.extend(self._unconfirmed.values())  # a rejoin: what the hub may not have
            self._outbox.extend(self._pending.values())
        first = message.get("first")
        if isinstance(first, dict):
            self._failure(first)
        ended = message.get("ended")
        if isinstance(ended, dict):
            self._end(ended)
        self._summary(message)

    def _failure(self, message: dict[str, Any]) -> None:
        failure = RemoteFailure(
            int(message["node"]),
            int(message["rank"]),
            str(message["label"]),
            int(message["code"]),
            message.get("signal"),
            str(message.get("host", "")),
            str(message.get("cause") or ""),
            int(message["gen"]),
        )
        with self.cond:
            if failure.generation in self.first:
                return  # said again (a welcome after a rejoin)
            self.first[failure.generation] = failure
            self._unconfirmed.pop(failure.generation, None)
            if failure.node != self.node:
                self.events.append(failure)
            self.cond.notify_all()
        self.wake()

    def _got(self, message: dict[str, Any]) -> None:
        topic = str(message["topic"])
        error = message.get("error")
        with self.cond:
            self._pending.pop(topic, None)
            self.results[topic] = (message.get("value"), str(error) if error is not None else None)
            while len(self.results) > KEEP_RESULTS:
                self.results.popitem(last=False)
            self.cond.notify_all()

    def _lost(self, message: dict[str, Any]) -> None:
        node = int(message["lost"])
        why = str(message.get("why") or "")
        self.final(Lost(node, str(message.get("host", "")), float(message["seconds"]), why, node == self.node))

    def _push(self, event: JobEvent) -> None:
        """An event the supervisor acts on (``poll``); whoever waits is woken."""
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()
        self.wake()

    def _left(self, message: dict[str, Any]) -> None:
        host, why = str(message.get("host", "")), str(message.get("why", ""))
        graceful = bool(message.get("graceful", False))
        self._push(Left(int(message["node"]), host, why, float(message.get("seconds", 0)), graceful))

    def _met(self, message: dict[str, Any]) -> None:
        """A meeting's answer (or a candidate's admission): the membership of the next generation."""
        meeting = Meeting.of(message)
        with self.cond:
            self._pending.pop(f"meet:{meeting.key}", None)
            self.meetings[meeting.key] = meeting
            while len(self.meetings) > KEEP_RESULTS:
                self.meetings.popitem(last=False)
            self.epoch = int(message.get("epoch", self.epoch))
            if self.candidate and self.node in meeting.members:
                self.candidate, self.admitted = False, meeting
            # what changed before the meeting is in its answer: it must not stop the generation it starts
            self.events[:] = [e for e in self.events if not isinstance(e, (Left, Regroup))]
            self.cond.notify_all()
        self.wake()

    def _regroup(self, message: dict[str, Any]) -> None:
        self._push(Regroup(str(message.get("why", ""))))

    def _end(self, message: dict[str, Any]) -> None:
        if int(message["node"]) != self.node:
            host, why = str(message.get("host", "")), str(message.get("why") or "")
            self.final(JobEnded(int(message["node"]), int(message["code"]), host, why))

    def _closing(self, message: dict[str, Any]) -> None:
        self.hub_closing = True

    def _summary(self, message: dict[str, Any]) -> None:
        if isinstance(message.get("summary"), dict):
            with self.cond:
                self.summary = message["summary"]

    def _view(self, message: dict[str, Any]) -> None:
        nodes = message.get("nodes")
        if not isinstance(nodes, dict):
            return
        with self.cond:
            for node, entry in nodes.items():
                if str(node).isascii() and str(node).isdigit() and int(node) != self.node:
                    self.view[int(node)] = entry
            self.view_at = time.monotonic()

    def final(self, event: Lost | JobEnded) -> None:
        """A lost node or the job's end: the first of its kind is kept and queued, later ones are not."""
        attr = "lost" if isinstance(event, Lost) else "ended"
        with self.cond:
            if getattr(self, attr) is None:
                setattr(self, attr, event)
                self.events.append(event)
            self.cond.notify_all()
        self.wake()

    def seen_view(self, now: float) -> dict[int, dict[str, Any]]:
        """This node's entry, and every node's while an asked-for view is fresh."""
        with self.cond:
            if now - self.view_at > VIEW_FRESH:
                return {n: e for n, e in self.view.items() if n == self.node}
            return dict(self.view)


_HANDLERS: dict[str, Callable[[AgentState, dict[str, Any]], None]] = {
    "welcome": AgentState._welcome,
    "fail": AgentState._failure,
    "got": AgentState._got,
    "lost": AgentState._lost,
    "end": AgentState._end,
    "closing": AgentState._closing,
    "sum": AgentState._summary,
    "view": AgentState._view,
    "left": AgentState._left,
    "met": AgentState._met,
    "regroup": AgentState._regroup,
}


def dealer(context: zmq.Context[Any], address: str, state: AgentState) -> zmq.Socket[Any]:
    """The agent's socket: it queues nothing for a hub it is not connected to (a late hub gets no backlog)."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 500)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.IDENTITY, f"node-{state.node}-{state.incarnation}".encode())
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)  # a hub that is not there yet: back off to every 2 s
    sock.connect(address)
    return sock


def receive(sock: zmq.Socket[Any], state: AgentState, secret: bytes, now: float) -> None:
    """One message the hub said, to the state (a message that does not verify is dropped).

    One per readiness: the poller is level-triggered, so a socket with more waiting is
    reported again at once; asking each socket whether more is there (``ZMQ_EVENTS``, or
    ending on ``zmq.Again``) cost more, for thousands of sockets, than the extra poll.
    """
    try:
        frame = sock.recv(zmq.NOBLOCK)  # the hub says one frame; a stray extra part fails its MAC on its own
    except zmq.Again:
        return
    message = unseal(secret, [frame])
    if message is not None:
        with contextlib.suppress(KeyError, TypeError, ValueError):  # signed by the job's secret, but malformed
            state.on_message(message, now)


def flush(sock: zmq.Socket[Any], state: AgentState, secret: bytes, now: float) -> None:
    """Everything due, sealed and sent without blocking; what the socket does not take waits if it must arrive."""
    out = state.due(now)
    for index, message in enumerate(out):
        try:
            sock.send_multipart(seal(secret, message), zmq.NOBLOCK)
        except zmq.ZMQError:  # not connected (yet) or the hub's pipe is full
            state.unsent(out[index:])
            return
