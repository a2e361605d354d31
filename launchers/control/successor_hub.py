"""A successor's hub (``succession``): its state from what every member holds, its port bound when it is free.

Nothing lives only on the old hub: the new one starts from the last membership with the silent
hubs left out (reported at the next meeting as any departure), past every member's epoch, and
learns the rest from what the members say again after its ``welcome``.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from launchers.control import messages as m
from launchers.control.membership import Membership
from launchers.control.succession import Inherited


def inherit(membership: Membership, inherited: Inherited, now: float) -> None:
    """The successor's roster and membership (``succession.Inherited``)."""
    membership.roster.inherit(inherited.members, (*inherited.gone, *inherited.departed), now)
    membership.graceful.update(inherited.departed)  # left out under the old hub's rule: no voters now
    for node in inherited.departed:  # said at the next meeting, with the rest (the old hub's ``left`` said why)
        membership.departed.append(m.Departure(node, "", "it was left out of the job before the hub moved"))
    membership.last_met = frozenset(inherited.members)
    membership.epoch = inherited.epoch + 1  # every contribution made under the old hub is void
    for node, host in zip(inherited.gone, inherited.hosts, strict=True):
        membership.roster.hosts[node] = host
        first = node == inherited.gone[0]
        graceful = first and bool(inherited.graceful)
        if graceful or (first and inherited.ended):
            membership.graceful.add(node)  # it said it leaves: not a voter of the majority
        seconds = inherited.seconds if first else 0.0
        membership.departed.append(m.Departure(node, host, inherited.why(node), seconds, graceful))


def bind(sock: zmq.Socket[Any], address: str, late: bool) -> str | None:
    """Bind ``address``; None once bound. ``late`` (a successor): a port still held is the address to try again
    (on one machine, the old hub's until its mlaunch ends), else the error is raised."""
    try:
        sock.bind(address)
    except zmq.ZMQError:
        if not late:
            raise
        time.sleep(0.05)
        return address
    return None
