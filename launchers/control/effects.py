"""What a membership decision asks the hub to do: values, applied by the hub in one place (``Hub._apply``).

The decisions (``membership.Membership``) change only the hub's record of the nodes (the
``roster``) and their own bookkeeping; everything that leaves that record (a message on the
socket, the end of the exchanges in flight, forgetting a node's socket, the job's end) is one
of these, returned in the order it must happen. So a decision is tested without a socket
(``tests/test_membership_decisions.py``), and the hub's socket is touched by the hub thread alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from launchers.control.messages import End, Message


@dataclass(frozen=True)
class Broadcast:
    """``message`` to every node that listens (encoded once)."""

    message: Message


@dataclass(frozen=True)
class Send:
    message: Message
    node: int


@dataclass(frozen=True)
class Multicast:
    """``message`` to ``nodes`` (encoded once: a meeting's result to its members)."""

    message: Message
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class VoidExchanges:
    """Every exchange in flight ends with ``reason`` (a step staged by only some of the old members never commits)."""

    reason: str


@dataclass(frozen=True)
class Drop:
    """Forget ``node``'s socket and status entry; ``tell``: say it to that socket now and whenever it speaks again."""

    node: int
    tell: Message | None = None


@dataclass(frozen=True)
class EndJob:
    """The hub ends the job on every node (unless it ended already): ``message`` to all, and to later joiners."""

    message: End


Effect = Broadcast | Send | Multicast | VoidExchanges | Drop | EndJob
