"""The control plane's sockets: encrypted and authenticated (CURVE, keyed from the job's key), bounded, watched.

Keys: every node derives the same two CURVE key pairs from the job's key (``wire.job_secret``):
the hub's, whose public half only the job's nodes can compute (it is never sent: CurveZMQ's
client must know it before its first byte), and one the agents share. A connection that does
not complete the handshake — raw bytes, another job, a stranger without the key — never
delivers a message; libsodium (bundled in pyzmq's wheels) encrypts every frame with a
per-connection session key, and its nonces refuse a replayed or re-ordered frame on the
connection. pyzmq's wheels always carry it (libzmq built with libsodium); without CURVE in the
installed libzmq (a source build without libsodium) the plane runs on ``wire`` alone — every
message MAC'd and numbered in its sender's stream, so a replayed or re-ordered one is still
dropped, but nothing is encrypted and anyone completes a connection — and says so
(``mlaunch status``: "not encrypted").

Bounds: a frame longer than ``MAX_IN`` closes the connection before it is held in memory
(``ZMQ_MAXMSGSIZE``); a connection that has not authenticated within ``handshake_limit``
(5 s, more for thousands of nodes) is closed (``ZMQ_HANDSHAKE_IVL``), so the connections of
strangers live at most that long; and no more than ``pending_limit`` of them are open at once:
libzmq has no such option (nor a hook before the handshake: ZAP is asked after it), so the hub
cuts the newest connections over the limit itself (``Strangers.shed``: ``shutdown(2)`` on the
accepted descriptor the monitor named; libzmq sees the peer gone and closes it).

``Strangers`` reads the hub's socket monitor: connections accepted, handshakes failed (raw
bytes, a wrong key), connections closed before or after their handshake; what it counts is
shown by ``mlaunch status``. Only the close of a connection that had authenticated tells the
membership a peer may have gone (``Hub._closed_connections``).
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import struct
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils import z85

MAX_IN = 16 << 20  # bytes: the largest message an agent says (a status entry is ~1 KiB; an exchange's value more)
HANDSHAKE = 5.0  # seconds a connection may take to authenticate, at least
HANDSHAKE_PER_NODE = 0.005  # and this much per node of the job: node 0 does every node's handshake (~0.3 ms of
# CPU each, on one I/O thread) when they all connect at once; cut sooner, they would be cut and come again


PENDING_MIN = 256  # connections not authenticated yet the hub keeps at once, at least (a member's own retry is one)


def pending_limit(nnodes: int) -> int:
    """How many connections may be unauthenticated at once: 256, or twice the nodes (all joining at once, twice)."""
    return max(PENDING_MIN, 2 * nnodes)


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

    cap: int = PENDING_MIN  # connections not authenticated yet, at most (``pending_limit``)
    port: int = 0  # the hub's port: a descriptor is cut only if it is still one of its connections
    accepted: int = 0
    authenticated: int = 0
    handshake_failed: int = 0  # raw bytes, another protocol, a wrong key, no handshake in time
    closed_unauthenticated: int = 0
    over_cap: int = 0  # connections cut at once because ``cap`` were unauthenticated (also closed_unauthenticated)
    open_fds: set[int] = field(default_factory=set)
    _handshaken: int = 0  # handshakes succeeded on connections still open (no fd in that event: a count)
    _newest: list[int] = field(default_factory=list)  # accepted over the cap since the last ``shed``

    def on_event(self, frames: list[bytes]) -> bool:
        """One monitor message; True when it is the close of an authenticated connection."""
        kind, value = _EVENT.unpack_from(frames[0])  # libzmq's monitor frame: event (u16), then its fd or code
        if kind == zmq.EVENT_ACCEPTED:
            self.accepted += 1
            self.open_fds.add(value)
            if self.pending() > self.cap:
                self._newest.append(value)
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

    def shed(self) -> None:
        """Cut the connections accepted over the cap, once the monitor's events so far are all read.

        Read first, so that a descriptor closed since (and its number reused) is no longer in
        ``open_fds``; and a descriptor is cut only while it is a TCP connection to the hub's
        port (never another of the process's sockets). The newest go: a flood's, while the held
        ones age out in ``handshake_limit`` and the members' connections stay. A member that
        reconnects while strangers fill the cap is cut too, and retries (every 2 s at most).
        """
        newest, self._newest = self._newest, []
        for fd in newest:
            if fd in self.open_fds and _cut(fd, self.port):
                self.over_cap += 1


def _cut(fd: int, port: int) -> bool:
    """``shutdown(2)`` a descriptor libzmq owns (it stays libzmq's to close); False if it is not the hub's."""
    try:
        conn = socket.socket(fileno=fd)
    except OSError:  # closed since, or not a socket now
        return False
    try:
        if conn.type != socket.SOCK_STREAM or conn.getsockname()[1] != port:
            return False
        conn.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            conn.detach()
