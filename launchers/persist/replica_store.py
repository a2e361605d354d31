"""The buddy's side of machine-loss replication: a data-path server holding a neighbour's staged slots.

Why its own socket (not the control plane): a slot is the rank's whole staged state (tens of MB
to GBs); the hub carries O(1)-sized messages for thousands of nodes, and a bulk copy queued
there would hold up every failure report behind it. So each node's mlaunch listens on a TCP
port of its own (an ephemeral one, announced through the control plane once per generation)
and its ring predecessor streams to it directly (``peer_copy``).

What it keeps: per (attempt, rank) the two newest complete images received — never more, so
a node holds at most two slots of each rank it is buddy to — in this process's anonymous
memory (``bytearray``). A slot is stored only once every byte arrived and its shard prefix
says it is whole; the sender is acknowledged then (it counts the slot as replicated).

Trust: every transfer starts with a JSON header sealed with the job's control-plane secret
(HMAC-SHA256); a connection whose header does not verify is closed, so only the job's own
mlaunch can fill a buddy's memory. The bytes are the rank's staged image as is.

Threads: one accepting, one per connection (a node has one predecessor; a reconnect replaces
it). They never print (the supervisor may fork while they run); ``messages`` carries what is
worth saying.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import queue
import socket
import struct
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from launchers.elastic.format import shardfile

KEEP = 2  # slots per (attempt, rank): the newest and the one before
_LEN = struct.Struct("<I")
_MAC = 32
MAX_HEADER = 1 << 16
_PIECE = 4 << 20


def seal_header(secret: bytes, header: Mapping[str, Any]) -> bytes:
    """A transfer's header frame: length, JSON, HMAC of the JSON."""
    raw = json.dumps(header, sort_keys=True).encode()
    return _LEN.pack(len(raw)) + raw + hmac.digest(secret, raw, hashlib.sha256)


def read_exact(sock: socket.socket, n: int) -> bytearray | None:
    """``n`` bytes from ``sock`` (None when it closed first)."""
    buf = bytearray(n)
    view = memoryview(buf)
    done = 0
    try:
        while done < n:
            got = sock.recv_into(view[done:], min(n - done, _PIECE))
            if got == 0:
                return None
            done += got
    finally:
        view.release()
    return buf


def open_header(secret: bytes, sock: socket.socket) -> dict[str, Any] | None:
    """The next verified header on ``sock`` (None: closed, too long, or not sealed with the job's secret)."""
    prefix = read_exact(sock, _LEN.size)
    if prefix is None:
        return None
    (length,) = _LEN.unpack(prefix)
    if length > MAX_HEADER:
        return None
    body = read_exact(sock, length + _MAC)
    if body is None:
        return None
    raw, mac = bytes(body[:length]), bytes(body[length:])
    if not hmac.compare_digest(hmac.digest(secret, raw, hashlib.sha256), mac):
        return None
    header = json.loads(raw)
    return header if isinstance(header, dict) else None


class ReplicaStore:
    """Slots other nodes streamed here: (attempt, rank) → step → image, the two newest of each."""

    def __init__(self, secret: bytes, bind: str = "0.0.0.0") -> None:
        self.secret = secret
        self._lock = threading.Lock()
        self._slots: dict[tuple[int, int], OrderedDict[int, bytearray]] = {}
        self._meta: dict[tuple[int, int], dict[str, Any]] = {}
        self.messages: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.received_bytes = 0
        self._server = socket.create_server((bind, 0), backlog=16)
        self.port = int(self._server.getsockname()[1])
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="mlaunch-replica-store", daemon=True)
        self._thread.start()

    # -- what the survivors' save reads -------------------------------------------------------------
    def holding(self, attempt: int) -> dict[int, list[int]]:
        """rank → steps held for ``attempt``."""
        with self._lock:
            return {r: sorted(s) for (a, r), s in self._slots.items() if a == attempt and s}

    def image(self, attempt: int, rank: int, step: int) -> bytearray | None:
        with self._lock:
            return self._slots.get((attempt, rank), OrderedDict()).get(step)

    def newest(self) -> dict[int, int]:
        """rank → the newest step held (any attempt's newest), for ``mlaunch status``."""
        with self._lock:
            newest_attempt = max((a for a, _ in self._slots), default=-1)
            return {r: max(s) for (a, r), s in self._slots.items() if a == newest_attempt and s}

    def bytes_held(self) -> int:
        with self._lock:
            return sum(len(b) for s in self._slots.values() for b in s.values())

    def drop_before(self, attempt: int) -> None:
        """Forget slots of attempts before ``attempt`` (their generation is over and its save done)."""
        with self._lock:
            for key in [k for k in self._slots if k[0] < attempt]:
                del self._slots[key]
                self._meta.pop(key, None)

    def put(self, attempt: int, rank: int, step: int, image: bytearray, meta: Mapping[str, Any]) -> None:
        with self._lock:
            slots = self._slots.setdefault((attempt, rank), OrderedDict())
            slots[step] = image
            slots.move_to_end(step)
            while len(slots) > KEEP:
                slots.popitem(last=False)
            self._meta[(attempt, rank)] = dict(meta)

    def meta(self, attempt: int) -> dict[int, dict[str, Any]]:
        with self._lock:
            return {r: dict(m) for (a, r), m in self._meta.items() if a == attempt}

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.close()

    # -- the threads --------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="mlaunch-replica-recv", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError), conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while not self._closed.is_set():
                header = open_header(self.secret, conn)
                if header is None:
                    return
                length = int(header["length"])
                image = read_exact(conn, length)
                if image is None:
                    return
                if shardfile.image_size(image[: min(length, 1 << 16)]) != length:
                    self.messages.put(f"replica store: rank {header.get('rank')}'s image is not a whole shard")
                    conn.sendall(b"\x00")
                    continue
                self.received_bytes += length
                meta = {"world": int(header["world"]), "sharded": bool(header.get("sharded")), "node": header["node"]}
                self.put(int(header["attempt"]), int(header["rank"]), int(header["step"]), image, meta)
                conn.sendall(b"\x01")
