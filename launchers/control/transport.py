"""The control plane's sockets: encrypted and authenticated (CURVE, keyed from the job's key), bounded, watched.

Keys: every node derives the same two CURVE key pairs from the job's key (``wire.job_secret``):
the hub's, whose public half only the job's nodes can compute (it is never sent: CurveZMQ's
client must know it before its first byte), and one the agents share. A connection that does
not complete the handshake — raw bytes, another job, a stranger without the key — never
delivers a message; libsodium (bundled in pyzmq's wheels) encrypts every frame with a
per-connection session key, and its nonces refuse a replayed or re-ordered frame on the
connection. Without CURVE in the installed libzmq (a source build without libsodium) the
plane runs on the HMAC of ``wire`` alone, and says so.

Bounds: a frame longer than ``MAX_IN`` closes the connection before it is held in memory
(``ZMQ_MAXMSGSIZE``); a connection that has not authenticated within ``handshake_limit``
(5 s, more for thousands of nodes) is closed (``ZMQ_HANDSHAKE_IVL``), so the connections of
strangers live at most that long.

``Strangers`` reads the hub's socket monitor: connections accepted, handshakes failed (raw
bytes, a wrong key), connections closed before or after their handshake; what it counts is
shown by ``mlaunch status``. Only the close of a connection that had authenticated tells the
membership a peer may have gone (``Hub._closed_connections``).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils import z85

MAX_IN = 16 << 20  # bytes: the largest message an agent says (a status entry is ~1 KiB; an exchange's value more)
HANDSHAKE = 5.0  # seconds a connection may take to authenticate, at least
HANDSHAKE_PER_NODE = 0.005  # and this much per node of the job: node 0 does every node's handshake (~0.3 ms of
# CPU each, on one I/O thread) when they all connect at once; cut sooner, they would be cut and come again


def handshake_limit(nnodes: int) -> float:
    """Seconds a connection may take to authenticate: 5 s, 20 s at 4,096 nodes (a stranger's lives that long)."""
    return max(HANDSHAKE, nnodes * HANDSHAKE_PER_NODE)


MONITORED = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_EVENT = struct.Struct("=HI")
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


def has_curve() -> bool:
    return bool(zmq.has("curve"))


@dataclass(frozen=True)
class CurveKeys:
    """The job's two CURVE key pairs (Z85), the same on every node: the hub's and the agents'."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def curve_keys(job_key: bytes) -> CurveKeys | None:
    """Both pairs derived from the job's key (None when libzmq has no CURVE)."""
    if not has_curve():
        return None

    def pair(role: bytes) -> tuple[bytes, bytes]:
        secret = z85.encode(hashlib.sha256(b"mlaunch-curve\0" + role + b"\0" + job_key).digest())
        return zmq.curve_public(secret), secret

    server_public, server_secret = pair(b"hub")
    client_public, client_secret = pair(b"agent")
    return CurveKeys(server_public, server_secret, client_public, client_secret)


def secure_hub(sock: zmq.Socket[Any], keys: CurveKeys | None, nnodes: int) -> None:
    """The hub's ROUTER: CURVE server (when there is CURVE), frames bounded, handshakes bounded in time."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_IN)
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(handshake_limit(nnodes) * 1000))
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)


def secure_agent(sock: zmq.Socket[Any], keys: CurveKeys | None, nnodes: int) -> None:
    """An agent's DEALER: CURVE client of the job's hub; what the hub says may be as large as the job's view."""
    sock.setsockopt(zmq.MAXMSGSIZE, max(4 * MAX_IN, nnodes * (64 << 10)))
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(handshake_limit(nnodes) * 1000))
    if keys is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)


@dataclass
class Strangers:
    """What the hub's socket monitor saw of connections: the counts ``mlaunch status`` shows.

    ``open_fds``: connections accepted and not closed yet; a close after the connection's
    handshake is a peer that may have gone (the membership's concern), one before it a
    stranger's (or a peer's own retry) and nothing more.
    """

    accepted: int = 0
    authenticated: int = 0
    handshake_failed: int = 0  # raw bytes, another protocol, a wrong key, no handshake in time
    closed_unauthenticated: int = 0
    open_fds: set[int] = field(default_factory=set)
    _handshaken: int = 0  # handshakes succeeded on connections still open (no fd in that event: a count)

    def on_event(self, frames: list[bytes]) -> bool:
        """One monitor message; True when it is the close of an authenticated connection."""
        kind, value = _EVENT.unpack_from(frames[0])  # libzmq's monitor frame: event (u16), then its fd or code
        if kind == zmq.EVENT_ACCEPTED:
            self.accepted += 1
            self.open_fds.add(value)
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.authenticated += 1
            self._handshaken += 1
        elif kind & _FAILED:
            self.handshake_failed += 1
        elif kind == zmq.EVENT_DISCONNECTED:
            self.open_fds.discard(value)
            # Which connection closed is known (its fd), whether it had authenticated is not: the
            # handshake event carries no fd. More closes than unauthenticated connections open → one of them.
            pending = len(self.open_fds) + 1 - self._handshaken
            if pending > 0:
                self.closed_unauthenticated += 1
                return False
            self._handshaken -= 1
            return True
        return False

    def pending(self) -> int:
        """Connections open that have not authenticated (bounded in time by ``handshake_limit``)."""
        return max(0, len(self.open_fds) - self._handshaken)
