"""What the supervisor and the runner see of the control plane (``JobEvents``), and its in-process form.

The supervisor reports its first local failure (``report_failure``) and, in its loop, asks
``poll()`` for what happened elsewhere: a ``RemoteFailure`` (another node's rank failed
first: stop this node's ranks too), ``Lost`` (a node stopped answering) or ``JobEnded``
(node 0's mlaunch ended the job: its last word). ``wake_fd``, when
not None, becomes readable when something arrived, so the loop wakes at once. The runner
asks who failed first in a generation (``first_failure``), meets the other nodes before a
restart (``exchange``), and the flash save agrees on its step through ``exchange``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from launchers.log import signal_name

if TYPE_CHECKING:
    from launchers.control.reductions import How, Reducers


class LocalFailure(Protocol):
    """A rank's failure as this node's supervisor saw it (``launchers.outcome.Failure``)."""

    label: str
    rank: int
    exit_code: int
    signal: int | None
    cause: str


class ExchangeFailed(RuntimeError):
    """Not every node contributed before the deadline, or a node was lost."""


class ExchangeTimedOut(ExchangeFailed):
    """Not every node contributed before the deadline: nothing else went wrong, so the same exchange may be asked
    again (a contribution said twice is taken once)."""


class HubMovedAway(Exception):
    """Node 0's mlaunch hosts a fresh hub and waits for the first meeting, but the job's hub answers on another
    node: this mlaunch started again before the others moved the hub away (``NetworkEvents.meet``). Not an
    ``ExchangeFailed``: the node goes on as a returning one (``join_moved_hub``), it does not fail."""


@dataclass(frozen=True)
class RemoteFailure:
    """The first failure of a generation, as every node learns it."""

    node: int
    rank: int
    label: str
    exit_code: int
    signal: int | None
    host: str = ""
    cause: str = ""  # e.g. "hung: no progress for 5m ...": the other nodes dump their stacks too
    generation: int = -1  # the attempt it ended (-1: not said); a stale one must not stop the next attempt

    def describe(self) -> str:
        how = f"killed by {signal_name(self.signal)}" if self.signal else "exited"
        where = f"node {self.node}" + (f" ({self.host})" if self.host else "")
        return f"{where} rank {self.rank} {how} with code {self.exit_code}"

    @property
    def hung(self) -> bool:
        return self.cause.startswith("hung")

    @property
    def node_label(self) -> str:
        """Who failed, named with its node (``node 1 rank 3``)."""
        return self.label if self.label.startswith("node ") else f"node {self.node} {self.label}"

    @classmethod
    def of(cls, node: int, failure: LocalFailure, host: str = "") -> RemoteFailure:
        return cls(node, failure.rank, failure.label, failure.exit_code, failure.signal, host, failure.cause or "")


@dataclass(frozen=True)
class Lost:
    """A node whose mlaunch stopped answering for ``monitor.node_timeout`` (the job ends).

    ``reason``: why an elastic job cannot go on without it; ``out``: this node itself was left
    out of an elastic job (it stops; a new mlaunch on it may rejoin).
    """

    node: int
    host: str
    seconds: float
    reason: str = ""
    out: bool = False

    def describe(self) -> str:
        where = f"node {self.node}" + (f" ({self.host})" if self.host else "")
        if self.out:
            return f"{where}: {self.reason}"
        return f"{where} is lost: its mlaunch sent nothing for {self.seconds:.1f}s" + (
            f"; {self.reason}" if self.reason else ""
        )


@dataclass(frozen=True)
class Left:
    """An elastic job left a node out (silent, its mlaunch ended or started again): the others re-form without it."""

    node: int
    host: str
    why: str
    seconds: float = 0.0
    graceful: bool = False  # its mlaunch was stopped and said so: its ranks write the dying checkpoint with ours

    def describe(self) -> str:
        where = f"node {self.node}" + (f" ({self.host})" if self.host else "")
        return f"{where} left the job: {self.why}"


@dataclass(frozen=True)
class Regroup:
    """The hub's node asks every node of an elastic job to stop its ranks gracefully and re-form (a node waits to
    join); node 0, or the node the hub moved to."""

    why: str

    def describe(self) -> str:
        return f"the hub's node re-forms the job: {self.why}"


@dataclass(frozen=True)
class Meeting:
    """An elastic job's members met before a generation: who runs it (platform node indexes) and what changed."""

    key: str
    generation: int
    members: tuple[int, ...]
    joined: tuple[tuple[int, str], ...] = ()  # (node, host) admitted at this meeting
    left: tuple[Left, ...] = ()  # left out since the meeting before
    restarts: int = 0  # the job's restarts after failures so far (the most any member said)
    regroup: str = ""  # node 0 re-formed the job since the meeting before (why)


@dataclass(frozen=True)
class JobEnded:
    """Node 0's mlaunch ended the job with ``exit_code`` (its last word on the plane).

    Nodes whose only processes follow node 0 (the MPI engine's peers: node 0's mpirun runs
    their ranks) stop them and exit with this code; any other node stops its ranks when the
    code is not 0 (the job is over: nobody is left to restart with), and finishes on its own
    when it is 0.
    """

    node: int
    exit_code: int
    host: str = ""
    why: str = ""  # the hub ended it for a node that left (a preemption below the elastic minimum)

    def describe(self) -> str:
        if self.why:
            return f"the job ended with exit code {self.exit_code}: {self.why}"
        where = f"node {self.node}" + (f" ({self.host})" if self.host else "")
        return f"{where} reports the job ended with exit code {self.exit_code}"


JobEvent = RemoteFailure | Lost | JobEnded | Left | Regroup


class JobEvents:
    """The control plane's interface; this base is the in-process one (one mlaunch runs every node)."""

    node = 0
    nnodes = 1
    wake_fd: int | None = None

    def __init__(self, reducers: Reducers | None = None) -> None:
        """``reducers``: the reductions exchanges may use (``reductions.BUILTIN`` and the callers' own)."""
        self.reducers = reducers
        self.generation = 0
        self._first: dict[int, RemoteFailure] = {}
        self._view: dict[int, dict[str, Any]] = {}
        self._summary: dict[str, Any] = {}

    @property
    def networked(self) -> bool:
        return False

    def join_moved_hub(self) -> bool:
        """After ``HubMovedAway``: stop this node's hub and join the one found, as a returning node (a candidate)."""
        return False

    @property
    def hosting(self) -> bool:
        """This mlaunch holds the job's whole view: one mlaunch runs every node here (on a network: the hub's node)."""
        return True

    @property
    def lost(self) -> Lost | None:
        return None

    @property
    def ended(self) -> JobEnded | None:
        """Node 0's word that the job is over (never for node 0 itself)."""
        return None

    def start_generation(self, generation: int) -> None:
        self.generation = generation

    def report_failure(self, failure: LocalFailure) -> None:
        """This node's first failure of the current generation."""
        self._first.setdefault(self.generation, RemoteFailure.of(self.node, failure))

    def poll(self) -> JobEvent | None:
        """What happened on other nodes since the last call: their first failure, a lost node, the job's end."""
        return None

    def first_failure(self, generation: int, wait: float = 0.0) -> RemoteFailure | None:
        """The job's first failure in ``generation`` (waiting up to ``wait`` seconds to hear it)."""
        return self._first.get(generation)

    def reduce(self, topic: str, value: Any, deadline: float, how: How) -> Any:
        """This node's part of a reduction over every member's ``value`` (``reductions``: ``how``); else ExchangeFailed.

        The hub waits for every member, reduces once and sends each node only what it needs:
        an aggregate (``count``, ``intersect``, ``max``, ``and``), node 0 the values (``gather0``),
        or each node its own share. ``topic`` is one of ``topics``' names. An ``Exchange``.
        """
        from launchers.control.reductions import ReductionError, local

        try:
            return local(how, self.node, value, self.reducers)
        except ReductionError as exc:
            raise ExchangeFailed(str(exc)) from None

    def exchange(self, topic: str, value: Any, deadline: float) -> dict[int, Any]:
        """Every node's ``value`` for ``topic`` (node → value) once all gave theirs; else ExchangeFailed.

        O(N) bytes to every node: where an aggregate or node 0 alone will do, ``reduce`` is O(1) per node.
        """
        from launchers.control.reductions import Reduction

        everyone = self.reduce(topic, value, deadline, Reduction.ALL)
        return {int(node): v for node, v in everyone.items()}

    def gathered(self, topic: str) -> dict[int, Any]:
        """Node 0 (hosting the hub): an unfinished exchange's values so far (None: a lost node's); elsewhere nothing."""
        return {}

    @property
    def status_every(self) -> float:
        """Seconds between status entries worth publishing (grows with the job's size on the plane)."""
        return 1.0

    def publish(self, entry: dict[str, Any]) -> None:
        """This node's status entry (``observe.status_file``): it goes up to node 0, which keeps every node's."""
        self._view[self.node] = entry

    def view(self) -> dict[int, dict[str, Any]]:
        """The status entries this node holds (node → entry), its own included.

        Node 0 (and a simulation) hold every node's; another node its own, and every node's
        for a moment after node 0 answered ``request_view`` (``mlaunch status`` asked there).
        """
        return dict(self._view)

    def view_stamp(self) -> float:
        """When (``time.monotonic()``) node 0's answer to ``request_view`` last came; 0 before any."""
        return 0.0

    def request_view(self) -> None:
        """Ask node 0 for every node's status entry once (``view`` has them when the answer came)."""

    def publish_summary(self, summary: dict[str, Any]) -> None:
        """Node 0: the job at a glance (phase, stragglers, committed step) for every node (``summary``)."""
        self._summary = dict(summary)

    def wire_stats(self) -> dict[str, Any] | None:
        """Node 0's hub: what strangers' messages and connections it dropped (``mlaunch status``); None elsewhere."""
        return None

    def summary(self) -> dict[str, Any]:
        """Node 0's newest summary of the job (empty until one came)."""
        return dict(self._summary)

    def close(self, exit_code: int) -> None:
        """Leave the job (node 0: tell every node the job ended with ``exit_code``, wait for them to leave)."""

    # -- an elastic job's membership (``membership``; only with one mlaunch per node) --------------
    @property
    def candidate(self) -> bool:
        """This node's mlaunch started while the job ran: it waits to be admitted, running no ranks."""
        return False

    def joined(self, deadline: float) -> bool:
        """Node 0's hub answered this node (False at ``deadline`` or once the hub is lost)."""
        return True

    def meet(self, key: str, generation: int, restarts: int, deadline: float, *, admit: bool = True) -> Meeting:
        """Every member's meeting before ``generation``: the membership it runs with; else ExchangeFailed."""
        return Meeting(key, generation, (self.node,), restarts=restarts)

    def admission(self, wait: float) -> Meeting | None:
        """A candidate: the meeting that admitted it, waiting up to ``wait`` seconds (None: not yet)."""
        return None

    def waiting(self) -> list[int]:
        """Node 0: the nodes waiting to be admitted."""
        return []

    def ready_to_join(self) -> list[int]:
        """Node 0: the waiting nodes whose standbys are warm (they said ``ready``)."""
        return []

    def ready(self) -> None:
        """A candidate: its standbys are warm; admitted now, its ranks start warm (no-op in process)."""

    def leave(self, why: str) -> None:
        """This node's mlaunch was stopped (SIGTERM): an elastic job goes on without it (no-op in process)."""

    def regroup(self, why: str) -> None:
        """Node 0: every member stops its ranks gracefully and meets (a waiting node is admitted there)."""


class LocalEvents(JobEvents):
    """A local simulation or a single node: no other agent, nothing to send."""
