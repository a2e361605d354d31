"""An elastic job's membership, kept by node 0's hub: who is in the job, who waits to join, when it changes.

Node indexes are the platform's (``VC_TASK_INDEX``, ``--rank``...): node 0 hosts the hub and the
rendezvous master and never leaves (without it there is no job to re-form). With an elastic
range ``(MIN, MAX)`` (``pytorch.nnodes: "MIN:MAX"``), instead of ending the job:

- a member that goes silent past ``node_timeout`` (or, just after a peer's TCP connection closed,
  past a few heartbeats: a killed mlaunch is found in about a second), whose mlaunch ended with
  a non-zero code (``bye``), or whose mlaunch started again (a new incarnation says ``hello``)
  is **left out** while at least MIN remain: ``left`` is broadcast, every exchange in flight
  is void (a step staged by only some of the old members must never be committed) and
  contributions of the old membership are refused from then on (``epoch``);
- a node that says ``hello`` and is not a member (it came back, or is new) is a **candidate**:
  it runs no ranks and is admitted, up to MAX, at the next **meeting** (``meet``: every member
  before each generation), whose result tells every member (and the admitted) the membership,
  who left and who joined since the last meeting, and the job's restart count;
- node 0 may ask every member to stop and re-form at once (``regroup``: a candidate waits and a
  checkpoint was just committed);
- a member whose mlaunch got SIGTERM (a preemption) says it is **leaving** at once: it is left out
  *gracefully* — its ranks are writing the job's dying checkpoint with everyone else's, so the
  others stop theirs gracefully too, nobody waits for it at the next meeting, and that checkpoint
  is the step the re-formed job resumes from. Waiting candidates count towards MIN: the job
  re-forms with them. When fewer than MIN would remain even so, the hub ends the job on every
  node at once (exit 143, saying why) instead of letting the others wait for a node that is gone.

Below MIN, node 0 lost, or without a range: the loss ends the job (``lost``), as before.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

import zmq

from launchers.control.cadence import Cadence
from launchers.control.gathers import KEEP_DONE, Done, Gathers

KEEP_MEETINGS = 64  # meeting results kept for a node that says its part again (a rejoin)
SUSPECT_AFTER_CLOSE = 1.5  # seconds of silence that make a member lost just after a peer's connection closed


class HubLike(Protocol):
    """What the membership uses of the hub (``hub.Hub``; a protocol, so this module imports no hub)."""

    members: set[int]
    left: set[int]
    peers: dict[int, bytes]
    seen: dict[int, float]
    hosts: dict[int, str]
    status: dict[int, Any]
    gathers: Gathers
    node_timeout: float

    def _broadcast(self, message: dict[str, Any]) -> None: ...
    def _send(self, node: int, message: dict[str, Any]) -> None: ...
    def _multicast(self, nodes: Iterable[int], message: dict[str, Any]) -> None: ...
    def _to(self, ident: bytes, frames: list[bytes] | dict[str, Any]) -> None: ...

    @property
    def cadence(self) -> Cadence: ...


class Membership:
    def __init__(self, hub: HubLike, span: tuple[int, int] | None) -> None:
        self.hub = hub
        self.span = span  # (MIN, MAX); None: the membership never changes (a loss ends the job)
        self.candidates: dict[int, float] = {}  # node → when it asked to join
        self.gone: set[bytes] = set()  # the sockets of incarnations left out: told so when they speak
        self.incarnations: dict[int, str] = {}
        self.epoch = 0  # bumped by every change and every meeting: a contribution of an older one is void
        self.departed: list[dict[str, Any]] = []  # since the last meeting
        self.meetings: dict[str, dict[int, dict[str, Any]]] = {}
        self.results: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.regroup_asked = ""
        self.closed_at = -1e9  # when a peer's TCP connection last closed (the socket monitor)
        self.monitor: zmq.Socket[Any] | None = None

    @property
    def elastic(self) -> bool:
        return self.span is not None

    def waiting(self) -> list[int]:
        return sorted(self.candidates)

    # -- who speaks -------------------------------------------------------------------------------
    def speaker(self, node: int, ident: bytes, message: dict[str, Any], now: float) -> bool:
        """False for a message of an incarnation that was left out (it is told so); notes a restarted mlaunch."""
        if ident in self.gone:
            self.hub._to(ident, self.out_message(node, "it was left out of the job earlier"))
            return False
        if self.span is not None and message.get("t") == "hello":
            incarnation = str(message.get("inc", ""))
            known = self.incarnations.get(node)
            self.incarnations[node] = incarnation
            if known is not None and known != incarnation and node in self.hub.members and node != 0:
                self.depart(node, "its mlaunch started again (the one before it ended)", now)
        return True

    def welcome(self, node: int, now: float) -> dict[str, Any]:
        """What ``welcome`` adds: a node that is not a member waits as a candidate."""
        if self.span is None or node in self.hub.members:
            return {}
        self.candidates.setdefault(node, now)
        return {"candidate": True, "in_job": len(self.hub.members), "max": self.span[1]}

    # -- leaving ----------------------------------------------------------------------------------
    def silence_limit(self, now: float) -> float:
        """``node_timeout``; just after a peer's connection closed, a few heartbeats (that mlaunch likely died)."""
        if self.span is None or now - self.closed_at > self.hub.node_timeout:
            return self.hub.node_timeout
        return min(self.hub.node_timeout, max(SUSPECT_AFTER_CLOSE, 2 * self.hub.cadence.heartbeat + 0.5))

    def on_silent(self, node: int, seconds: float, now: float) -> str | None:
        """A node silent past the limit: None when handled (left out, a candidate dropped), else why the job ends."""
        if self.candidates.pop(node, None) is not None:
            self.hub.seen.pop(node, None)
            self.hub.peers.pop(node, None)
            return None
        why = f"its mlaunch sent nothing for {seconds:.1f}s"
        if now - self.closed_at <= self.hub.node_timeout and seconds < self.hub.node_timeout:
            why += " after a connection to the control plane closed"
        if self.depart(node, why, now, seconds):
            return None
        return self._cannot_leave(node)

    def on_bye(self, node: int, code: int, now: float) -> bool:
        """A member whose mlaunch ended with a non-zero code leaves the job (True); else it only left."""
        if self.candidates.pop(node, None) is not None:  # a candidate that gave up waiting is never admitted
            return False
        if self.span is None or code == 0 or node not in self.hub.members:
            return False
        return self.depart(node, f"its mlaunch ended with exit code {code}", now)

    def on_leaving(self, node: int, why: str, now: float) -> dict[str, Any] | None:
        """A member's mlaunch was stopped (SIGTERM): left out gracefully; else the ``end`` message that ends the job.

        None also when there is nothing to do (no range, node 0 — its stop ends the job anyway —,
        or not a member: a candidate's stop is its ``bye``).
        """
        if self.span is None or node == 0 or node not in self.hub.members:
            self.candidates.pop(node, None)
            return None
        if self.depart(node, why, now, graceful=True):
            return None
        return {
            "t": "end",
            "node": node,
            "code": 143,
            "host": self.hub.hosts.get(node, ""),
            "why": (
                f"node {node} is leaving ({why}), and the job cannot go on without it: "
                f"{self._cannot_leave(node)}; every node stops"
            ),
        }

    def depart(self, node: int, why: str, now: float, seconds: float = 0.0, graceful: bool = False) -> bool:
        """Leave ``node`` out (True), or False when the job cannot go on without it (node 0, below MIN).

        Waiting candidates count towards MIN: the next meeting admits them. ``graceful``: its mlaunch
        said it is leaving (its ranks are saving with everyone's), not lost: it is not told it was left
        out, and its silence is never judged again.
        """
        hub = self.hub
        if self.span is None or node == 0 or node not in hub.members:
            return False
        if len(hub.members) - 1 + len(self.candidates) < self.span[0]:
            return False
        hub.members.discard(node)
        self.epoch += 1
        ident = hub.peers.pop(node, None)
        hub.seen.pop(node, None)
        hub.status.pop(node, None)
        entry = {"node": node, "host": hub.hosts.get(node, ""), "why": why, "seconds": round(seconds, 3)}
        if graceful:
            entry["graceful"] = True
            hub.left.add(node)  # it said so: it is gone, not lost (a new mlaunch there says hello as a candidate)
        self.departed.append(entry)
        hub._broadcast({"t": "left", **entry, "members": len(hub.members)})
        if ident is not None and not graceful:  # a link that came back: that mlaunch learns it is out and stops
            self.gone.add(ident)
            hub._to(ident, self.out_message(node, why))
        self._void(f"node {node} left the job ({why}); an exchange of the old membership is void")
        for key in list(self.meetings):
            self._check_meeting(key)
        return True

    def _cannot_leave(self, node: int) -> str:
        if self.span is None:
            return ""
        if node == 0:
            return "node 0 hosts the control plane and the rendezvous master: the job cannot re-form without it"
        left = len(self.hub.members) - 1
        waiting = f" and {len(self.candidates)} waiting to join" if self.candidates else ""
        return f"only {left} node(s) would remain{waiting}, below the elastic minimum {self.span[0]} (pytorch.nnodes)"

    def out_message(self, node: int, why: str) -> dict[str, Any]:
        what = f"this node was left out of the job: {why}; start its mlaunch again to rejoin"
        return {"t": "lost", "lost": node, "host": self.hub.hosts.get(node, ""), "seconds": 0.0, "why": what}

    def _void(self, error: str) -> None:
        """Every exchange in flight ends with ``error`` (a repeated contribution gets it too)."""
        gathers = self.hub.gathers
        opened = list(gathers.open.items())
        gathers.open.clear()
        for topic, gather in opened:
            gathers.done[topic] = Done(None, {}, error)
            self.hub._multicast(gather.values, {"t": "got", "topic": topic, "error": error})
        while len(gathers.done) > KEEP_DONE:
            gathers.done.popitem(last=False)

    def current(self, message: dict[str, Any]) -> bool:
        """A contribution made under the membership the hub has now (an older one is void)."""
        return self.span is None or int(message.get("epoch", 0)) == self.epoch

    # -- meeting ----------------------------------------------------------------------------------
    def meet(self, node: int, message: dict[str, Any]) -> None:
        key = str(message["key"])
        done = self.results.get(key)
        if done is not None:
            self.hub._send(node, done)  # said again after a rejoin
            return
        if node not in self.hub.members:
            return
        self.meetings.setdefault(key, {})[node] = message
        self._check_meeting(key)

    def _check_meeting(self, key: str) -> None:
        said = self.meetings.get(key)
        members = self.hub.members
        if said is None or not members <= said.keys():
            return
        del self.meetings[key]
        joined: list[int] = []
        if self.span is not None and all(part.get("admit", True) for part in said.values()):
            joined = sorted(self.candidates)[: max(0, self.span[1] - len(members))]
            for node in joined:
                del self.candidates[node]
                members.add(node)
        self.epoch += 1
        result = {
            "t": "met",
            "key": key,
            "gen": max(int(part.get("gen", 0)) for part in said.values()),
            "members": sorted(members),
            "joined": [{"node": n, "host": self.hub.hosts.get(n, "")} for n in joined],
            "left": self.departed,
            "epoch": self.epoch,
            "restarts": max(int(part.get("restarts", 0)) for part in said.values()),
            "regroup": self.regroup_asked,
        }
        self.departed, self.regroup_asked = [], ""
        self.results[key] = result
        while len(self.results) > KEEP_MEETINGS:
            self.results.popitem(last=False)
        self.hub._multicast(sorted(members), result)  # one encoding of an O(N) result, not one per member

    def regroup(self, why: str) -> None:
        """Node 0 asks every member to stop its ranks gracefully and meet (a candidate is admitted there)."""
        if self.span is not None and self.candidates and not self.regroup_asked:
            self.regroup_asked = why
            self.hub._broadcast({"t": "regroup", "why": why})

    # -- a peer's connection closed ---------------------------------------------------------------
    def watch(self, sock: zmq.Socket[Any]) -> None:
        """Learn when a peer's TCP connection closes (its process ended): silent members are judged sooner."""
        if self.span is not None:
            self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def closed_connections(self) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        while True:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.closed_at = time.monotonic()

    def close(self, sock: zmq.Socket[Any]) -> None:
        if self.monitor is not None:
            sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None
