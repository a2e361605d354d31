"""How the hub says things (a part of ``hub.Hub``): sealed once, numbered in the hub's stream, sent without blocking.

Only the hub's thread calls these (it owns the socket). A peer that cannot take a message (its
link is down, it does not read) is skipped: the heartbeats tell.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import zmq

from launchers.control import messages as m
from launchers.control.hub_counts import Traffic
from launchers.control.roster import NodeStatus, Roster
from launchers.control.wire import Outgoing, encode, seal

_MORE, _LAST = int(zmq.SNDMORE | zmq.NOBLOCK), int(zmq.NOBLOCK)  # plain ints: the per-peer loop is the cost


class Sending:
    """The hub's sending half; ``hub.Hub`` holds the state named here."""

    secret: bytes
    sent: Outgoing
    sock: zmq.Socket[Any]
    peers: dict[int, bytes]
    roster: Roster
    traffic: Traffic
    _last_broadcast: float
    _encoded: tuple[m.Message, bytes] | None = None  # the last message said to one node, and its payload

    def _send(self, node: int, message: m.Message) -> None:
        """Encoded once while it is the same message: a meeting's answer said again to each member that asks
        (after a successor's ``welcome`` every member says its part again) is O(N) to encode, each time."""
        cached = self._encoded
        if cached is None or cached[0] is not message:
            cached = self._encoded = (message, encode(message.to_wire()))
        self._send_frames(node, seal(self.secret, cached[1], self.sent))

    def _multicast(self, nodes: Iterable[int], message: m.Message) -> None:
        """One encoding, the same bytes to ``nodes`` (a meeting's members, an exchange's contributors)."""
        frames = seal(self.secret, message.to_wire(), self.sent)
        for node in nodes:
            self._send_frames(node, frames)

    def _send_frames(self, node: int, frames: list[bytes]) -> None:
        ident = self.peers.get(node)
        if ident is not None and self.roster.of(node) is not NodeStatus.LOST:
            self._to(ident, frames)

    def _to(self, ident: bytes, frames: list[bytes] | m.Message) -> None:
        payload = seal(self.secret, frames.to_wire(), self.sent) if isinstance(frames, m.Message) else frames
        try:  # unroutable or full (a peer whose link is down, or that does not read): heartbeats tell
            self.sock.send_multipart([ident, *payload], zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        self.traffic.messages_out += 1
        self.traffic.bytes_out += sum(len(f) for f in payload)

    def _broadcast(self, message: m.Message) -> None:
        """One encoding, the same bytes to every node still in the job (the loop is the per-peer cost: keep it bare)."""
        began = self._last_broadcast = time.monotonic()
        (body,) = seal(self.secret, message.to_wire(), self.sent)
        send, sent = self.sock.send, 0
        skip = self.roster.quiet
        for node, ident in list(self.peers.items()):
            if node not in skip:
                try:
                    send(ident, _MORE)
                    send(body, _LAST)
                    sent += 1
                except zmq.ZMQError:  # a peer that cannot take it: heartbeats tell
                    pass
        took = time.monotonic() - began
        self.traffic.messages_out += sent
        self.traffic.bytes_out += sent * len(body)
        self.traffic.slowest_broadcast = max(self.traffic.slowest_broadcast, took)
        self.traffic.broadcasts[message.KIND] = (began, took)
