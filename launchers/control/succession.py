"""Which node hosts the hub, and which side of a split job may go on: pure functions of what every agent holds.

No node is special (issue 45). The hub, and the ranks' rendezvous master with it, lives on the
**lowest member in platform order** of the job's last membership (the last meeting's answer,
``met``, which every member holds): node 0 at the first start, the next lowest member once node 0
is gone. When the hub falls silent every member computes the same successor from the same
membership (``next_hub``), so they all reconnect to one node, and that node's mlaunch starts the
new hub. A successor that is itself unreachable is passed over the same way (``tried``).

No split brain (``may_go_on``): a side goes on only when it holds at least MIN nodes *and* a
majority of the last membership: more than half to move the hub, half for the side that holds it
(a tie is the hub's). Two disjoint sides cannot both pass, so at most one side of any partition
re-forms; the other side's hub cannot complete
a departure, declares the silent nodes lost and its mlaunches end non-zero. A member that is on no
other side is not counted (``graceful``): one that said it leaves (SIGTERM, an exit code), and one
whose connection closed before its silence (its mlaunch ended: a partition closes nothing), so
killed nodes still let the job shrink down to MIN.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass


def hub_of(members: Iterable[int]) -> int:
    """The node that hosts the hub for ``members`` (platform indexes): the lowest."""
    return min(members)


def next_hub(members: Iterable[int], tried: Collection[int]) -> int | None:
    """The lowest member not in ``tried`` (the hubs found silent so far), or None: nobody is left to host it."""
    left = [node for node in members if node not in tried]
    return min(left) if left else None


def may_go_on(
    last: Collection[int], remaining: Collection[int], minimum: int, graceful: Collection[int] = (), hub: bool = False
) -> bool:
    """Whether ``remaining`` may go on as the job after the others of ``last`` (the last membership) left.

    ``minimum``: the range's MIN. ``graceful``: members of ``last`` that said they were leaving:
    they agreed to go, so the majority is taken of ``last`` without them. ``hub``: the side that holds
    the hub needs half (a tie is its), the other side more than half, to move the hub: two disjoint
    sides can never both pass, whatever the partition.
    """
    said, here = set(graceful), set(remaining)  # sets: a list here made each agent's move O(N²), 0.36 s at 4,096
    voters = [node for node in last if node not in said]  # those on no other side are not counted
    holding = sum(1 for node in voters if node in here)
    return len(remaining) >= minimum and (2 * holding > len(voters) or (hub and 2 * holding == len(voters)))


@dataclass(frozen=True)
class Inherited:
    """What a successor's hub starts from: the last membership every member holds, and the hubs found silent.

    Nothing lives only on the old hub: the generation, the restart count and the admission of
    candidates come with each member's ``meet`` (said again after the new hub's ``welcome``), the
    staged and committed steps are the ranks' and the checkpoint's, the first failure of a generation
    is said again by the node that had it. The new hub's epoch is past every member's, so a
    contribution made under the old hub is void, as after any departure.
    """

    members: tuple[int, ...]  # the last meeting's membership, the silent hubs among them
    gone: tuple[int, ...]  # the hubs found silent, in the order they were tried
    hosts: tuple[str, ...]  # their hosts (the same order)
    seconds: float  # how long the first of them had been silent
    epoch: int  # the members' epoch (the last meeting's): the new hub starts past it
    graceful: str = ""  # the first hub's node said it is leaving (SIGTERM): why; its ranks save with ours
    ended: bool = False  # the first hub's connection closed (its mlaunch ended): it is on no other side
    departed: tuple[int, ...] = ()  # members the old hub left out since the last meeting (its decision stands)

    def why(self, node: int) -> str:
        first = self.gone[0]
        if node == first and self.graceful:
            return f"{self.graceful}; the hub it hosted moved"
        if node == first:
            return f"its mlaunch, hosting the control plane, sent nothing for {self.seconds:.1f}s; the hub moved"
        return f"it was to host the control plane after node {first} and did not answer; the hub moved on"


def successor(
    members: Sequence[int], tried: Collection[int], minimum: int, graceful: Collection[int] = ()
) -> int | None:
    """The node that hosts the hub once ``tried`` are silent (or ``graceful``: said they leave), or None.

    None when nobody is left, or when the rest hold no strict majority of ``members`` (the other
    side of a partition may hold it) or fewer than ``minimum`` nodes.
    """
    silent = set(tried)
    rest = [node for node in members if node not in silent]
    if not may_go_on(members, rest, minimum, graceful):
        return None
    return next_hub(members, tried)
