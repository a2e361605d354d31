"""An agent's life on the control plane: one ``AgentPhase``, changed only by the named transitions below.

::

    JOINING ──welcome──► MEMBER ◄──met (with this node)── CANDIDATE ◄──welcome (not a member)── JOINING
                           │  └──────────welcome (not a member any more)──────────►┘
                           │ (any phase above)
                           ├──closing──► CLOSING (node 0's hub stops: its silence is no loss)
                           ├──lost (a node, or the hub silent)──► LOST
                           ├──end──► ENDED
                           └──out (this node left out of an elastic job)──► LEFT_OUT

LOST, ENDED and LEFT_OUT are final: the first of them is this node's end on the plane, and a
later word changes nothing (the event that caused it is kept: ``final``). A move the diagram
does not have raises ``IllegalPhase``.
"""

from __future__ import annotations

from enum import Enum, auto


class AgentPhase(Enum):
    """Where an agent is in its life (``describe``: in words)."""

    JOINING = auto()  # saying hello until the hub answers
    MEMBER = auto()  # runs ranks with the job
    CANDIDATE = auto()  # elastic: waits to be admitted, running no ranks
    CLOSING = auto()  # the hub said it stops
    LOST = auto()  # a node (or the hub) was lost: the job ends
    ENDED = auto()  # node 0's mlaunch (or the hub) ended the job
    LEFT_OUT = auto()  # an elastic job goes on without this node

    def describe(self) -> str:
        return self.name.lower().replace("_", " ")


FINAL = frozenset({AgentPhase.LOST, AgentPhase.ENDED, AgentPhase.LEFT_OUT})
_ENDS = frozenset({AgentPhase.CLOSING, *FINAL})
MOVES: dict[AgentPhase, frozenset[AgentPhase]] = {
    AgentPhase.JOINING: frozenset({AgentPhase.MEMBER, AgentPhase.CANDIDATE, *_ENDS}),
    AgentPhase.MEMBER: frozenset({AgentPhase.CANDIDATE, *_ENDS}),
    AgentPhase.CANDIDATE: frozenset({AgentPhase.MEMBER, *_ENDS}),
    AgentPhase.CLOSING: FINAL,
    **{phase: frozenset() for phase in FINAL},
}


class IllegalPhase(RuntimeError):
    """An agent asked to move between phases its life does not connect."""


class Life:
    """The phase, and when the hub first answered (which silence limit applies)."""

    def __init__(self) -> None:
        self.phase = AgentPhase.JOINING
        self.welcomed = False  # the hub answered once (then ``node_timeout`` applies, not ``join_timeout``)

    @property
    def final(self) -> bool:
        return self.phase in FINAL

    def welcome(self, candidate: bool) -> None:
        """The hub answered hello: a member, or (elastic) a candidate. A final phase stays."""
        self.welcomed = True
        if self.phase in _ENDS:
            return
        target = AgentPhase.CANDIDATE if candidate or self.phase is AgentPhase.CANDIDATE else AgentPhase.MEMBER
        if target is not self.phase:
            self._move(target)

    def admit(self) -> bool:
        """A meeting named this candidate a member (True); a meeting of members changes nothing."""
        if self.phase is not AgentPhase.CANDIDATE:
            return False
        self._move(AgentPhase.MEMBER)
        return True

    def closing(self) -> None:
        if self.phase not in _ENDS:
            self._move(AgentPhase.CLOSING)

    def end(self, phase: AgentPhase) -> bool:
        """This node's end on the plane (True); False when it had ended already (the first one stands)."""
        if phase not in FINAL:
            raise IllegalPhase(f"{phase.describe()} is not an end")
        if self.final:
            return False
        self._move(phase)
        return True

    def _move(self, target: AgentPhase) -> None:
        if target not in MOVES[self.phase]:
            raise IllegalPhase(f"an agent that is {self.phase.describe()} cannot become {target.describe()}")
        self.phase = target
