"""One agent's side of the protocol apart from its thread and socket: what it says when, what the hub's words mean.

A ``driver.Driver`` thread gives it a DEALER socket and runs ``receive`` / ``flush``: one agent for a node's
mlaunch (``NetworkEvents``), thousands from one poller per process for the control-plane benchmark (so it
measures what a node does). The messages are ``messages`` (the protocol's one definition), answered through
``messages.handlers`` (``on_<kind>`` below); its life is ``life``, its part of the status view ``status_mirror``.

Reliability: the DEALER socket queues nothing for a hub it is not connected to (ZMQ ``IMMEDIATE``), so a hub
that starts late receives no backlog of stale heartbeats; ``hello`` is said again every ``hello_retry`` until
``welcome`` comes. What must arrive (the kinds ``messages`` marks ``RELIABLE``) is kept in the outbox until the
socket takes it, and failure reports, contributions and meetings not yet answered are said again after every
``welcome`` (a rejoin, or a new hub: ``succession``); the hub takes a repeated one once. Every field is behind
``cond``: the node's threads hand work in, the driver's thread takes it out and delivers the hub's words.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from launchers.control import messages as m
from launchers.control.cadence import Cadence, after_close, cadence
from launchers.control.events import (
    ExchangeFailed,
    ExchangeTimedOut,
    JobEnded,
    JobEvent,
    Left,
    LocalFailure,
    Lost,
    Meeting,
    Regroup,
)
from launchers.control.life import AgentPhase, Life
from launchers.control.reductions import How, wire
from launchers.control.status_mirror import StatusMirror
from launchers.control.succession import Inherited, successor
from launchers.control.topics import feature
from launchers.control.wire import Incoming, Outgoing
from launchers.log import say

STALLED = 1.0  # a gap between the driver's checks (every 0.2 s) that means this process did not run
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
        elastic: tuple[int, int] | None = None,
        hosts: Sequence[str] = (),
        mover: Callable[[int, Inherited], str | None] | None = None,
    ) -> None:
        """``elastic``: the node range; with it (and a ``mover``) a member whose hub falls silent moves to the
        next hub (``succession``) instead of ending. ``hosts``: the platform's host of each node index.
        ``mover(node, inherited)``: starts the hub here when ``node`` is this one; the address to join, or None."""
        self.node = node
        self.nnodes = nnodes
        self.host = host
        self.node_timeout = node_timeout
        self.join_timeout = max(node_timeout, join_timeout)
        self.cadence: Cadence = cadence(nnodes, node_timeout)
        self.incarnation = secrets.token_hex(4)
        self.wire_out, self.wire_in = Outgoing(), Incoming()  # issue 47: this run's stream; the hub's (replays: no)
        self.cond = threading.Condition()
        self.wake = wake  # something arrived that the supervisor's loop acts on
        self.life = Life()
        self.final: Lost | JobEnded | None = None  # what ended this node's part (LOST, LEFT_OUT, ENDED)
        self.generation = 0
        self.epoch = 0  # the membership this node's contributions belong to (an elastic job: the last meeting's)
        self.first: dict[int, m.Fail] = {}  # generation → the job's first failure in it
        self.events: list[JobEvent] = []
        self.results: OrderedDict[str, tuple[Any, str | None]] = OrderedDict()
        self.meetings: OrderedDict[str, Meeting] = OrderedDict()
        self.admitted: Meeting | None = None  # the meeting that made this candidate a member
        self.status = StatusMirror(node)  # this node's entry going up, node 0's summary and view coming down
        self._outbox: deque[m.Message] = deque()
        self._pending: dict[str, m.Message] = {}  # topic or meeting → a contribution not answered yet
        self._unconfirmed: dict[int, m.Fail] = {}  # generation → failure report not yet echoed
        now = time.monotonic()
        self.started = self.heard = self._checked = now
        self.hub_here: Callable[[], bool] = lambda: False  # the hub runs in this process and its thread lives
        self.hub_closed = -1e9  # when the connection to the hub last closed (its mlaunch likely ended)
        self.span, self.hosts, self.mover = elastic, tuple(hosts), mover
        self.hub = 0  # the node hosting the hub (``succession.hub_of`` the membership)
        self.members: tuple[int, ...] = tuple(range(nnodes))  # the last meeting's membership
        self.tried: tuple[int, ...] = ()  # hubs found silent since the last meeting
        self.departed: tuple[int, ...] = ()  # members the hub left out since the last meeting (``left``)
        self.moving = False  # joined a new hub: hello until it answers
        self.move_to: str | None = None  # the driver reconnects the socket there
        self._last_sent = -1e9
        self._next_hello = now

    # -- what the supervisor reads ------------------------------------------------------------------
    @property
    def phase(self) -> AgentPhase:
        return self.life.phase

    @property
    def welcomed(self) -> bool:
        return self.life.welcomed

    @property
    def candidate(self) -> bool:
        return self.life.phase is AgentPhase.CANDIDATE

    @property
    def lost(self) -> Lost | None:
        return self.final if isinstance(self.final, Lost) else None

    @property
    def ended(self) -> JobEnded | None:
        return self.final if isinstance(self.final, JobEnded) else None

    # -- what the node's side hands in (any thread) ---------------------------------------------
    def send(self, message: m.Message) -> None:
        with self.cond:
            self._outbox.append(message)

    def report_failure(self, failure: LocalFailure) -> None:
        with self.cond:
            message = m.Fail(
                self.node, failure.rank, failure.label, failure.exit_code, failure.signal,
                failure.cause or "", self.generation,
            )  # fmt: skip
            self._unconfirmed[self.generation] = message
            self._outbox.append(message)

    def contribute(self, topic: str, value: Any, how: How) -> None:
        with self.cond:
            message = m.Put(self.node, topic, wire(how), value, self.epoch)
            self.results.pop(topic, None)
            self._pending[topic] = message
            self._outbox.append(message)

    def publish(self, entry: dict[str, Any]) -> None:
        with self.cond:
            self.status.publish(entry)

    def ask_view(self, now: float) -> None:
        with self.cond:
            if self.status.ask(now):
                self._outbox.append(m.Ask(self.node))

    def result(self, topic: str, deadline: float) -> Any:
        """The hub's answer to this node's contribution, waiting until ``deadline``; else ExchangeFailed."""
        with self.cond:
            while topic not in self.results:
                if self.final is not None:
                    raise ExchangeFailed(self.final.describe())
                if time.monotonic() >= deadline:
                    raise ExchangeTimedOut(f"not every node answered {feature(topic)!r} in time")
                self.cond.wait(max(0.0, deadline - time.monotonic()))  # an answer, a loss or the end notifies
            value, error = self.results[topic]
        if error is not None:
            raise ExchangeFailed(f"{feature(topic)!r}: {error}")
        return value

    def meet(self, key: str, generation: int, restarts: int, admit: bool) -> None:
        """This node's part of an elastic job's meeting (said again after a rejoin until answered)."""
        with self.cond:
            message = m.Meet(self.node, key, generation, restarts, admit)
            self._pending[f"meet:{key}"] = message
            self._outbox.append(message)

    def flush_status(self) -> None:
        """Send the newest status entry now (leaving: node 0 keeps the last word of every node)."""
        with self.cond:
            self.status.flush()

    # -- what the driver does (the socket's thread) ---------------------------------------------
    def due(self, now: float) -> list[m.Message]:
        """The messages to send now."""
        out: list[m.Message] = []
        with self.cond:
            if self.move_to is not None:  # the socket is still the old hub's: everything waits for the new one
                return out
            while self._outbox:
                out.append(self._outbox.popleft())
            welcomed = self.life.welcomed
            if (not welcomed or self.moving) and now >= self._next_hello:
                self._next_hello = now + self.cadence.hello_retry
                out.append(m.Hello(self.node, self.host, self.incarnation, self.generation))
            entry = self.status.due(now, self.cadence.status) if welcomed else None
            if entry is not None:
                out.append(m.Status(self.node, entry))
            if welcomed and not out and now - self._last_sent >= self.cadence.heartbeat:
                out.append(m.Heartbeat(self.node))
            if out:
                self._last_sent = now
        return out

    def unsent(self, messages: list[m.Message]) -> None:
        """The socket did not take ``messages``: keep what must arrive for the next round, in order."""
        with self.cond:
            self._outbox.extendleft(reversed([message for message in messages if message.RELIABLE]))
            if any(isinstance(message, m.Hello) for message in messages):
                self._next_hello = 0.0  # not connected yet: say it as soon as the connection is up

    def on_hub_closed(self, now: float) -> None:
        """The TCP connection to the hub closed: its process ended (a cut link closes nothing), so the
        silence that follows judges node 0 in a few heartbeats, as the hub judges a member (``check``)."""
        self.hub_closed = now

    def check(self, now: float) -> None:
        """The hub lost after ``node_timeout`` of silence (``join_timeout`` before it answered; the short fuse once its
        connection closed). Seconds this process did not run (gaps over ``STALLED``) are not its silence."""
        gap, self._checked = now - self._checked, now  # a live hub in this process is starved, never lost (CI)
        self.heard = now if self.hub_here() else self.heard + max(0.0, gap - STALLED)
        silent, welcomed = now - self.heard, self.life.welcomed
        limit = self.node_timeout if welcomed else self.join_timeout
        closed = welcomed and self.heard < self.hub_closed
        if closed:
            limit = min(limit, after_close(self.node_timeout, self.cadence.heartbeat))
        if silent > limit and self.life.phase is not AgentPhase.CLOSING and not self.life.final:
            if self._move(now, silent):
                return
            what = "the master, hosting the control plane" + (
                "" if welcomed else "; it never answered: not started, unreachable, or another job secret"
            )
            if closed and silent < self.node_timeout:
                what += "; its connection closed"
            self.end(AgentPhase.LOST, Lost(self.hub, what, silent))

    def _move(self, now: float, silent: float, leaving: str = "") -> bool:
        """The hub is silent (or ``leaving``): join the next (``succession``), its loss told as any member's."""
        if self.span is None or self.mover is None or self.life.phase is not AgentPhase.MEMBER:
            return False
        tried, gone = (*self.tried, self.hub), tuple(n for n in self.departed if n not in self.tried)
        ended = bool(leaving) or self.heard < self.hub_closed  # said so, or its connection closed: no other side
        after = successor(self.members, (*tried, *gone), self.span[0], (*gone, *((self.hub,) if ended else ())))
        if after is None:
            return False
        hosts = tuple(self.hosts[n] if n < len(self.hosts) else "" for n in tried)
        inherited = Inherited(self.members, tried, hosts, round(silent, 3), self.epoch, leaving, ended, gone)
        try:
            address = self.mover(after, inherited)
        except (zmq.ZMQError, OSError) as exc:  # a hub that cannot start here: the job ends, as before
            say(f"control plane: node {self.node} cannot host the hub: {exc}")
            address = None
        if address is None:
            return False
        with self.cond:
            old, first = self.hub, not self.tried
            self.tried, self.hub, self.moving, self.move_to = tried, after, True, address
            self.heard, self._next_hello, self.hub_closed = now, now, -1e9
            if first:
                self.events.append(Left(old, hosts[0], inherited.why(old), round(silent, 3), bool(leaving)))
            self.cond.notify_all()
        said = f"is leaving ({leaving})" if leaving else f"sent nothing for {silent:.1f}s"
        say(f"control plane: node {old}'s hub {said}; node {self.node} joins node {after}'s")
        self.wake()
        return True

    def take_move(self) -> str | None:
        """The address of the hub to reconnect to, once (the driver's thread)."""
        with self.cond:
            address, self.move_to = self.move_to, None
        return address

    def on_message(self, message: m.Message, now: float) -> None:
        self.heard = now
        if (handler := _HANDLERS.get(message.KIND)) is not None:
            handler(self, message)

    # -- the hub's words (``messages.handlers``) ---------------------------------------------------
    def on_welcome(self, welcome: m.Welcome) -> None:
        with self.cond:
            if self.moving and welcome.hub != self.hub:  # the old hub's answer to a hello it got before the move
                return
            self.moving = False
            self.hub = welcome.hub  # where it runs: a node that joins after the hub moved learns it here
            self.life.welcome(welcome.candidate)
            self.cond.notify_all()
            self.cadence = Cadence.of(welcome, self.cadence)
            self._outbox.extend(self._unconfirmed.values())  # a rejoin: what the hub may not have
            self._outbox.extend(self._pending.values())
        if welcome.first is not None:
            self.on_fail(welcome.first)
        if welcome.ended is not None:
            self.on_end(welcome.ended)
        if welcome.summary is not None:
            self.on_summary(m.Summary(summary=welcome.summary))

    def on_heartbeat(self, beat: m.Heartbeat) -> None:
        """Nothing but the sign of life every message is."""

    def on_fail(self, fail: m.Fail) -> None:
        with self.cond:
            if fail.generation in self.first:
                return  # said again (a welcome after a rejoin)
            self.first[fail.generation] = fail
            self._unconfirmed.pop(fail.generation, None)
            if fail.node != self.node:
                self.events.append(fail.event())
            self.cond.notify_all()
        self.wake()

    def on_got(self, got: m.Got) -> None:
        with self.cond:
            self._pending.pop(got.topic, None)
            self.results[got.topic] = (got.value, got.error)
            while len(self.results) > KEEP_RESULTS:
                self.results.popitem(last=False)
            self.cond.notify_all()

    def on_lost(self, lost: m.Lost) -> None:
        mine = lost.node == self.node  # this node, declared lost earlier, came back too late
        self.end(AgentPhase.LOST, Lost(lost.node, lost.host, lost.seconds, lost.why, mine))

    def on_left_out(self, out: m.LeftOut) -> None:
        self.end(AgentPhase.LEFT_OUT, Lost(out.node, out.host, 0.0, out.why, True))

    def on_left(self, left: m.Left) -> None:  # the hub's own node leaving gracefully (SIGTERM): the hub moves now
        departure = left.departure
        handed_over = departure.node == self.hub and departure.graceful and departure.node != self.node
        if handed_over and self._move(time.monotonic(), 0.0, departure.why or "its mlaunch was stopped"):
            return
        self.departed = (*self.departed, departure.node)
        self._push(departure.event())

    def on_met(self, met: m.Met) -> None:
        """A meeting's answer (or a candidate's admission): the membership of the next generation.

        The same answer can come twice: a late second welcome makes the agent say its pending meeting
        again and the hub answers it again from its cache. The repeat is dropped: it would otherwise
        clear a ``Left`` that came after the meeting (CI under load lost one that way).
        """
        meeting = met.meeting()
        with self.cond:
            if meeting.key in self.meetings:
                return
            self._pending.pop(f"meet:{meeting.key}", None)
            self.meetings[meeting.key] = meeting
            while len(self.meetings) > KEEP_RESULTS:
                self.meetings.popitem(last=False)
            self.epoch = met.epoch
            self.members, self.tried, self.departed = meeting.members, (), ()
            if self.node in meeting.members and self.life.admit():
                self.admitted = meeting
            # what changed before the meeting is in its answer: it must not stop the generation it starts
            self.events[:] = [e for e in self.events if not isinstance(e, (Left, Regroup))]
            self.cond.notify_all()
        self.wake()

    def on_regroup(self, regroup: m.Regroup) -> None:
        self._push(Regroup(regroup.why))

    def on_end(self, end: m.End) -> None:  # the hub's end naming this node too (``why``: it left below MIN)
        if end.node != self.node or end.why:
            self.end(AgentPhase.ENDED, end.event())

    def on_closing(self, closing: m.Closing) -> None:  # not the old hub's, after a move: no silence judged after
        with self.cond:
            if not self.moving:
                self.life.closing()

    def on_summary(self, summary: m.Summary) -> None:
        if summary.summary is not None:
            with self.cond:
                self.status.summary = summary.summary

    def on_view(self, view: m.View) -> None:
        with self.cond:
            self.status.answered(view.nodes, time.monotonic())

    def _push(self, event: JobEvent) -> None:
        """An event the supervisor acts on (``poll``); whoever waits is woken."""
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()
        self.wake()

    def end(self, phase: AgentPhase, event: Lost | JobEnded) -> None:
        """This node's end on the plane: the first one is kept and queued for the supervisor, later ones are not."""
        with self.cond:
            if self.life.end(phase):
                self.final = event
                self.events.append(event)
            self.cond.notify_all()
        self.wake()

    def seen_view(self, now: float) -> dict[int, dict[str, Any]]:
        """This node's entry, and every node's while an asked-for view is fresh."""
        with self.cond:
            return self.status.seen(now)


_HANDLERS = m.handlers(AgentState, m.HUB)
