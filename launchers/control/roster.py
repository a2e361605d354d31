"""What node 0's hub knows of each node: one ``NodeStatus`` per node, changed only by named transitions.

::

                   hello (not a member; elastic)         admitted at a meeting
    (unknown) ─────────────────────────────────► CANDIDATE ─────────────────► MEMBER
        ▲                                          │  silent, bye, leaving        │ │ │
        └──────────────────── dropped ◄────────────┘                              │ │ │
    LEFT_OUT ◄── left out (elastic: silent, ended, restarted, leaving) ───────────┘ │ │
        │  hello (a new mlaunch there) → CANDIDATE                                   │ │
    SAID_BYE ◄── said bye (and is not left out) ─────────────────────────────────────┘ │
        │  hello (a rejoin) → MEMBER                                                    │
    LOST ◄── silent past node_timeout, and the job cannot go on without it ─────────────┘

Every node index starts as a MEMBER (the job's nodes; they join when they start). The job's
membership, what every exchange and meeting waits for, is MEMBER, SAID_BYE and LOST: a node
that said bye or was lost is still one of the nodes the job ran with (its end follows), while
LEFT_OUT and CANDIDATE nodes are not. Broadcasts go to MEMBER and CANDIDATE nodes, and those
alone are judged by their silence. A transition the diagram does not have raises
``IllegalTransition``: a bug, named, instead of a node in two states at once.

The derived sets (``members``, ``quiet``) are cached and rebuilt at each transition, which are
rare: an exchange's every ``put`` and every broadcast read them, at thousands of nodes.
"""

from __future__ import annotations

from enum import Enum, auto


class NodeStatus(Enum):
    MEMBER = auto()  # in the job: exchanges and meetings wait for it
    CANDIDATE = auto()  # elastic: waits to be admitted at the next meeting; runs no ranks
    SAID_BYE = auto()  # its mlaunch left on purpose (said ``bye``)
    LEFT_OUT = auto()  # elastic: the job goes on without it
    LOST = auto()  # silent past node_timeout, and the job ends for it

    def describe(self) -> str:
        return self.name.lower().replace("_", " ")


IN_JOB = frozenset({NodeStatus.MEMBER, NodeStatus.SAID_BYE, NodeStatus.LOST})
LISTENING = frozenset({NodeStatus.MEMBER, NodeStatus.CANDIDATE})  # told broadcasts, judged by silence


class IllegalTransition(RuntimeError):
    """A node asked to change status in a way its life does not allow."""


class Roster:
    """Node → status, with when each node was last heard and its host name (data the statuses do not carry)."""

    def __init__(self, nnodes: int, host: int = 0) -> None:
        """``host``: the node whose mlaunch runs the hub (node 0, or its successor)."""
        self.host = host
        self.status: dict[int, NodeStatus] = dict.fromkeys(range(nnodes), NodeStatus.MEMBER)
        self.seen: dict[int, float] = {}  # node → when it was last heard (monotonic)
        self.hosts: dict[int, str] = {}
        self.version = 0  # bumped by every transition
        self.heard_version = 0  # bumped by every node heard for the first time (or again after it was forgotten)
        self.ready: set[int] = set()  # candidates that said ``ready`` (their ranks would start warm)
        self.members: frozenset[int] = frozenset()
        self.quiet: frozenset[int] = frozenset()  # told no broadcast: said bye, left out, lost
        self._derive()

    def of(self, node: int) -> NodeStatus | None:
        return self.status.get(node)

    def nodes(self, status: NodeStatus) -> list[int]:
        return sorted(n for n, s in self.status.items() if s is status)

    def heard(self, node: int, now: float) -> None:
        if node not in self.seen:
            self.heard_version += 1
        self.seen[node] = now

    def mark_ready(self, node: int) -> bool:
        """A candidate said ``ready``: True when that is news (the published view must change)."""
        if self.status.get(node) is not NodeStatus.CANDIDATE or node in self.ready:
            return False
        self.ready.add(node)
        self.version += 1
        return True

    # -- the transitions --------------------------------------------------------------------------
    def wait(self, node: int) -> None:
        """A node that is not a member said hello (elastic): it waits to be admitted."""
        self._move(node, (None, NodeStatus.LEFT_OUT), NodeStatus.CANDIDATE)

    def admit(self, node: int) -> None:
        self._move(node, (NodeStatus.CANDIDATE,), NodeStatus.MEMBER)

    def drop(self, node: int) -> None:
        """A candidate that went silent, said bye or is leaving: forgotten (never admitted)."""
        self._move(node, (NodeStatus.CANDIDATE,), None)
        self.seen.pop(node, None)

    def leave_out(self, node: int) -> None:
        self._move(node, (NodeStatus.MEMBER,), NodeStatus.LEFT_OUT)
        self.seen.pop(node, None)

    def said_bye(self, node: int) -> None:
        self._move(node, (NodeStatus.MEMBER,), NodeStatus.SAID_BYE)

    def rejoin(self, node: int) -> None:
        """A node that said bye says hello again (its mlaunch started again)."""
        self._move(node, (NodeStatus.SAID_BYE,), NodeStatus.MEMBER)

    def lose(self, node: int) -> None:
        self._move(node, (NodeStatus.MEMBER,), NodeStatus.LOST)

    def inherit(self, members: tuple[int, ...], gone: tuple[int, ...], now: float) -> None:
        """A successor's hub (``succession``): the last membership, its silent hubs left out, the rest heard now.

        Heard now: a member that is gone as well is judged by its silence from here (``node_timeout``),
        never waited for as one that never started."""
        self.status = dict.fromkeys(members, NodeStatus.MEMBER)
        self.seen = {node: now for node in members}
        self._derive()
        for node in gone:
            if self.status.get(node) is NodeStatus.MEMBER:
                self.leave_out(node)

    # -- questions ----------------------------------------------------------------------------------
    def everyone_left(self) -> bool:
        """Every node but the hub's own that was heard said bye, was left out or is lost (none heard: at once)."""
        status, host = self.status, self.host
        return not any(node != host and status.get(node) in LISTENING for node in self.seen)

    def _move(self, node: int, sources: tuple[NodeStatus | None, ...], target: NodeStatus | None) -> None:
        now = self.status.get(node)
        if now not in sources:
            names = " or ".join(s.describe() if s else "unknown" for s in sources)
            raise IllegalTransition(f"node {node} is {now.describe() if now else 'unknown'}, not {names}")
        self.ready.discard(node)  # a candidate's readiness ends with it (a new hello starts over)
        if target is None:
            del self.status[node]
        else:
            self.status[node] = target
        self.version += 1
        self._derive()

    def _derive(self) -> None:
        self.members = frozenset(n for n, s in self.status.items() if s in IN_JOB)
        self.quiet = frozenset(n for n, s in self.status.items() if s not in LISTENING)
