"""Where a starting mlaunch finds the job's hub: pure decisions over what a bounded probe heard (issue 45, item 3).

The hub lives on node 0 at the first start and moves to the lowest surviving member when node 0
is lost (``succession``). A node whose mlaunch starts again after a move — the old node 0
restarted by its platform with its same environment (rank 0, master address = itself), or any
other returning node — would look for the hub at the platform's master address and find nobody
there (node 0 would even start a hub of its own, that no member ever joins). So before it decides,
an mlaunch of an elastic job whose platform names every node's host probes the job's other hosts
on the control port (``hub_probe``): a signed ``hello`` over the job's CURVE keys, answered only by a
hub holding the job's key with a signed ``welcome`` that names the node hosting it.

- ``targets``: whom to probe. Node 0 probes every other node; another node every node but itself
  and node 0 (the master address is where it goes anyway). Without a host list or a range: nobody
  (the hub cannot move, so it is where it always was).
- ``decide``: a hub answered → join it, as any returning node (a candidate, admitted at the next
  membership change per ``elastic.grow``); none did → node 0 hosts the hub, the others join it at the
  master address, exactly as before.

Why this cannot make two hubs at a fresh start: a node other than node 0 hosts a hub only after a
hub it joined fell silent (``AgentState._move`` needs a welcomed member), so while no job runs no
other host answers and node 0 hosts, as before. And the probe is bounded (``hub_probe``): a refused
or unreachable port answers in milliseconds, a host that says nothing is given ``CONNECT_WAIT``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum


class Answer(Enum):
    """What one probed node's control port said."""

    HUB = "the job's hub answered"
    ABSENT = "nothing listens there"  # refused, unreachable, no such host
    STRANGER = "something without the job's key listens there"  # the handshake failed
    SILENT = "no answer in time"

    def decided(self) -> bool:
        """Known for good: the probe need not wait on this node any longer."""
        return self is not Answer.SILENT


PROBED_AT_MOST = 16  # the lowest nodes probed: the hub is on the lowest surviving member (``succession``)


def targets(node: int, movable: bool, hosts: Sequence[str]) -> tuple[int, ...]:
    """The nodes whose control port ``node``'s mlaunch probes before it joins or hosts the hub.

    ``movable``: an elastic job whose platform names every node's host (the hub can have moved).
    Node 0 probes the other nodes, another node every node but itself and node 0 (it goes to the
    master address, node 0's, when nobody else answers): the lowest ``PROBED_AT_MOST`` of them, as
    the hub moves to the lowest surviving member, and a probe of thousands of ports would cost a
    socket each (a hub past them is missed: this node waits at its own hub or node 0's, alone).
    Each host once (its lowest node): one host's control port is one hub, and two probes of it would
    hand the agent's identity from one connection to the other (``ROUTER_HANDOVER``) as one closes."""
    if not movable:
        return ()
    probed: dict[str, int] = {}
    for n, host in enumerate(hosts):
        if n not in (node, 0) and host and host not in probed:
            probed[host] = n
            if len(probed) == PROBED_AT_MOST:
                break
    return tuple(probed.values())


@dataclass(frozen=True)
class Place:
    """Where this mlaunch's agent goes: ``host`` the hub here (node 0, nobody answered), or ``join`` the
    hub that answered (None: the master address, as before). ``said``: the line to say, or empty."""

    host: bool
    join: int | None
    said: str = ""


def decide(node: int, answers: Mapping[int, Answer], hub: int | None) -> Place:
    """Join the hub that answered (``hub``: the node its welcome named), else node 0 hosts, as at any first start.

    ``answers``: node → what its port said. A node that answered without the job's key, or said
    nothing in time, is named when node 0 hosts after all: a hub there would be one this node
    cannot reach (its members go on without it; alone it is below MIN or no majority, so no second
    job forms, but it is said)."""
    if hub is not None and any(answer is Answer.HUB for answer in answers.values()):
        said = f"control plane: node {node}: the job's hub runs on node {hub} (it moved there); joining it"
        return Place(host=False, join=hub, said=said)
    unclear = sorted(n for n, answer in answers.items() if answer in (Answer.STRANGER, Answer.SILENT))
    said = ""
    if unclear:
        what = "; ".join(f"node {n}: {answers[n].value}" for n in unclear)
        said = f"control plane: node {node}: no hub of this job answered on the other nodes ({what})"
    return Place(host=node == 0, join=None, said=said)
