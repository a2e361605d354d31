"""The control plane's protocol, defined once: every message kind, its fields, who says it, whether it must arrive.

One frozen dataclass per kind. Its fields are named once, here: the same name in code and on
the wire (JSON, ``"t"`` naming the kind; ``wire`` seals it). ``KINDS`` is the table both ends
dispatch on (``handlers``: each side's ``on_<kind>`` methods, checked against the table when
the module that holds them is imported) and the documentation's message table is generated
from (``docs/gen/reference.py``). ``tests/test_control_messages.py`` fails when a kind or a
field's wire name is spelled anywhere else in the source tree.

Who says what (``SENDERS``): an agent's messages name the node that says them (``node``); the
hub's messages name the node they are about, where there is one. ``RELIABLE`` kinds are kept in
the agent's outbox until its socket takes them; the rest are said again anyway (a heartbeat,
the newest status entry, a hello until it is answered). Decoding ignores fields it does not
know and raises KeyError, TypeError or ValueError for a required field that is missing or does
not convert: the receiver drops (and counts) such a message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from launchers.control import events
from launchers.control.codec import Record, decoder, encode_into, field_names

KIND_FIELD = "t"  # the wire's field naming a message's kind
AGENT, HUB = "agent", "hub"


class Message(Record):
    """A message: a ``Record`` with its kind (``KIND``) on the wire."""

    __slots__ = ()

    KIND: ClassVar[str]
    SENDERS: ClassVar[tuple[str, ...]]  # AGENT (to the hub), HUB (to agents), or both
    RELIABLE: ClassVar[bool] = False  # kept until sent (an agent's outbox), not said again anyway
    WHEN: ClassVar[str]  # the documentation's words: when it is said
    SIZE: ClassVar[str] = "O(1)"

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {KIND_FIELD: self.KIND}
        encode_into(self, wire)
        return wire


# -- the parts of messages ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Departure(Record):
    """A node an elastic job left out, as the hub says it (``left`` at once, and in the next ``met``)."""

    node: int
    host: str = ""
    why: str = ""
    seconds: float = 0.0  # how long it had been silent (0: it did not go silent)
    graceful: bool = False  # its mlaunch said it is leaving (its ranks save with everyone's)

    def event(self) -> events.Left:
        return events.Left(self.node, self.host, self.why, self.seconds, self.graceful)


@dataclass(frozen=True, slots=True)
class Joined(Record):
    """A node a meeting admitted."""

    node: int
    host: str = ""


# -- agent → hub --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello(Message):
    KIND, SENDERS = "hello", (AGENT,)
    WHEN = "joining or rejoining; said again every `hello_retry` until the hub answers"
    node: int
    host: str = ""
    incarnation: str = ""  # this mlaunch's run of the node: a new one replaces the old (elastic)
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    KIND, SENDERS = "hb", (AGENT, HUB)
    WHEN = "only after a heartbeat interval in which the sender said nothing else (the hub: broadcast nothing else)"
    node: int | None = None  # the agent's; the hub's heartbeat names none (bytes to every node, every interval)


@dataclass(frozen=True, slots=True)
class Status(Message):
    KIND, SENDERS, SIZE = "st", (AGENT,), "O(ranks per node)"
    WHEN = "the node's status entry (its ranks' steps, rates, checkpoints, flags), the newest once per status interval"
    node: int
    entry: Any = None


@dataclass(frozen=True, slots=True)
class Fail(Message):
    KIND, SENDERS, RELIABLE = "fail", (AGENT, HUB), True
    WHEN = "a node's first failure of a generation; the hub relays the first of each generation to all, no later one"
    node: int
    rank: int
    label: str
    exit_code: int
    signal: int | None = None
    cause: str = ""
    generation: int = 0
    host: str = ""  # the hub adds it

    def event(self) -> events.RemoteFailure:
        return events.RemoteFailure(
            self.node, self.rank, self.label, self.exit_code, self.signal, self.host, self.cause, self.generation
        )


@dataclass(frozen=True, slots=True)
class Put(Message):
    KIND, SENDERS, RELIABLE, SIZE = "put", (AGENT,), True, "the value"
    WHEN = "a contribution to an exchange, and how the hub reduces it (`reductions.Reduction`)"
    node: int
    topic: str
    how: Any
    value: Any = None
    epoch: int = 0  # the membership it was made under (elastic): an older one's is void


@dataclass(frozen=True, slots=True)
class Ask(Message):
    KIND, SENDERS, RELIABLE = "ask", (AGENT,), True
    WHEN = "`mlaunch status` on that node wants the whole view"
    node: int


@dataclass(frozen=True, slots=True)
class Summary(Message):
    KIND, SENDERS, RELIABLE = "sum", (AGENT, HUB), True
    WHEN = "node 0's summary of the job (phase, stragglers, committed step) when it changed; the hub relays it"
    node: int | None = None  # node 0's, to the hub; the hub's relay names none
    summary: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class End(Message):
    KIND, SENDERS, RELIABLE = "end", (AGENT, HUB), True
    WHEN = "node 0's exit code as it leaves (the hub tells all, and later joiners); the hub's end of an elastic job"
    node: int
    exit_code: int
    host: str = ""
    why: str = ""  # the hub ended it (a node leaving below the elastic minimum)

    def event(self) -> events.JobEnded:
        return events.JobEnded(self.node, self.exit_code, self.host, self.why)


@dataclass(frozen=True, slots=True)
class Meet(Message):
    KIND, SENDERS, RELIABLE = "meet", (AGENT,), True
    WHEN = "elastic: a member's part of the meeting before a generation; said again after a rejoin until answered"
    node: int
    key: str
    generation: int = 0
    restarts: int = 0
    admit: bool = True  # False: a meeting that must not admit candidates (the health check's)


@dataclass(frozen=True, slots=True)
class Regroup(Message):
    KIND, SENDERS, RELIABLE = "regroup", (AGENT, HUB), True
    WHEN = "elastic, node 0: every member stops its ranks gracefully and meets (a waiting node is admitted there)"
    node: int = 0
    why: str = ""


@dataclass(frozen=True, slots=True)
class Leaving(Message):
    KIND, SENDERS, RELIABLE = "leaving", (AGENT,), True
    WHEN = "the node's mlaunch got SIGTERM: an elastic job leaves it out gracefully, or ends (below MIN)"
    node: int
    why: str = ""


@dataclass(frozen=True, slots=True)
class Ready(Message):
    KIND, SENDERS = "ready", (AGENT,)
    WHEN = (
        "elastic, a candidate: its warm standbys are ready (admitted now, its ranks start warm); said again "
        "every half second while it waits, so a grow at a checkpoint waits for it, not the other way round"
    )
    node: int


@dataclass(frozen=True, slots=True)
class Bye(Message):
    KIND, SENDERS, RELIABLE = "bye", (AGENT,), True
    WHEN = "leaving on purpose (not lost), with the mlaunch's exit code"
    node: int
    exit_code: int = 0


# -- hub → agents ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Welcome(Message):
    KIND, SENDERS = "welcome", (HUB,)
    WHEN = "answer to `hello`: the cadence, the generation's first failure, the summary, the job's end if said"
    members: int
    heartbeat: float
    status_every: float
    hello_retry: float
    candidate: bool = False  # elastic: not a member; it waits to be admitted
    in_job: int = 0
    max_nodes: int = 0
    first: Fail | None = None
    ended: End | None = None
    summary: dict[str, Any] | None = None
    hub: int = 0  # the node whose mlaunch hosts the hub (``succession``): a node joining after it moved learns it


@dataclass(frozen=True, slots=True)
class Got(Message):
    KIND, SENDERS = "got", (HUB,)
    SIZE = "O(1) for aggregates"
    WHEN = "the node's part of an exchange's result, or why the exchange failed"
    topic: str
    value: Any = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Lost(Message):
    KIND, SENDERS = "lost", (HUB,)
    WHEN = "a node silent for `monitor.node_timeout` the job cannot go on without (to all; to it, if it comes back)"
    node: int
    host: str = ""
    seconds: float = 0.0
    why: str = ""


@dataclass(frozen=True, slots=True)
class LeftOut(Message):
    KIND, SENDERS = "out", (HUB,)
    WHEN = "elastic: to a node left out of the job (its old link came back, or it speaks again): it stops"
    node: int
    host: str = ""
    why: str = ""


@dataclass(frozen=True, slots=True)
class Left(Message):
    KIND, SENDERS = "left", (HUB,)
    WHEN = "elastic: a member was left out (silent, ended, restarted, or leaving gracefully): the others re-form"
    departure: Departure
    members: int = 0


@dataclass(frozen=True, slots=True)
class Met(Message):
    KIND, SENDERS, SIZE = "met", (HUB,), "O(members)"
    WHEN = "elastic: every member met: the membership of the next generation, who joined and left; to the admitted too"
    key: str
    generation: int
    members: tuple[int, ...]
    joined: tuple[Joined, ...] = ()
    left: tuple[Departure, ...] = ()
    epoch: int = 0
    restarts: int = 0
    regroup: str = ""

    def meeting(self) -> events.Meeting:
        joined = tuple((j.node, j.host) for j in self.joined)
        left = tuple(d.event() for d in self.left)
        return events.Meeting(self.key, self.generation, self.members, joined, left, self.restarts, self.regroup)


@dataclass(frozen=True, slots=True)
class View(Message):
    KIND, SENDERS, SIZE = "view", (HUB,), "O(N)"
    WHEN = "every node's status entry, answering `ask` (encoded at most once a second for all askers)"
    nodes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Closing(Message):
    KIND, SENDERS = "closing", (HUB,)
    WHEN = "the hub stops (its silence after this is not a loss)"


ALL: tuple[type[Message], ...] = (
    Hello, Heartbeat, Status, Fail, Put, Ask, Summary, End, Meet, Regroup, Leaving, Ready, Bye,
    Welcome, Got, Lost, LeftOut, Left, Met, View, Closing,
)  # fmt: skip
KINDS: dict[str, type[Message]] = {cls.KIND: cls for cls in ALL}
_DECODE: dict[str, Callable[[Mapping[str, Any]], Message]] = {cls.KIND: decoder(cls) for cls in ALL}


def decode(wire: Mapping[str, Any]) -> Message | None:
    """The message, None for a kind this protocol does not have; KeyError/TypeError/ValueError when malformed."""
    kind = wire[KIND_FIELD]
    if not isinstance(kind, str):
        raise TypeError(f"a message's kind is a string, not {type(kind).__name__}")
    decode_kind = _DECODE.get(kind)
    return decode_kind(wire) if decode_kind is not None else None


def sender(wire: Mapping[str, Any], nnodes: int) -> int | None:
    """The node an agent's message names (checked before anything else is read of it), or None: not one of the job's."""
    node = wire.get("node")
    return node if isinstance(node, int) and 0 <= node < nnodes else None


def handler_name(cls: type[Message]) -> str:
    return "on_" + re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def handlers(receiver: type, sender: str) -> dict[str, Callable[..., Any]]:
    """Kind → ``receiver``'s ``on_<kind>`` for every kind ``sender`` says; a missing one is a TypeError at import."""
    table: dict[str, Callable[..., Any]] = {}
    for cls in ALL:
        if sender in cls.SENDERS:
            method = getattr(receiver, handler_name(cls), None)
            if method is None:
                raise TypeError(f"{receiver.__name__} handles no {cls.KIND!r} ({handler_name(cls)})")
            table[cls.KIND] = method
    return table


def wire_names() -> set[str]:
    """Every kind and every field name the wire carries (what only this module may spell)."""
    names = {KIND_FIELD, *KINDS}
    for cls in (*ALL, Departure, Joined):
        names.update(field_names(cls))
    return names
