"""The buddy's side of machine-loss replication: a data-path server holding a neighbour's staged slots.

Why its own socket (not the control plane): a slot is the rank's whole staged state (tens of MB
to GBs); the hub carries O(1)-sized messages for thousands of nodes, and a bulk copy queued
there would hold up every failure report behind it. So each node's mlaunch listens on a TCP
port of its own (an ephemeral one, announced through the control plane once per generation)
and its ring predecessor streams to it directly (``peer_copy``).

What it keeps: per (attempt, rank) two complete images received — the newest, and the round's
anchor the sender names (``replica_plan.keep_after``: the step every node kept, what a loss
falls back to at worst) — never more, so a node holds at most two slots of each rank it is
buddy to, in this process's anonymous memory (``bytearray``). A slot is stored only once every
byte arrived and its shard prefix says it is whole; the sender is acknowledged then (it counts
the slot as replicated).

Trust: every transfer starts with a JSON header sealed with the job's control-plane secret
(HMAC-SHA256); a connection whose header does not verify is closed, so only the job's own
mlaunch can fill a buddy's memory. The image follows as is, then its keyed digest
(``image_mac``: HMAC-SHA256 under the same secret, bound to the header's MAC, so an image
cannot be moved under another header): a slot whose digest does not match is refused,
counted (``refused``) and never stored, so the survivors' commit never writes it.

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
from collections.abc import Mapping
from typing import Any

from launchers.elastic.format import shardfile
from launchers.persist.replica_plan import keep_after

KEEP = 2  # slots per (attempt, rank) at most: the newest and the anchor (before one is agreed: the one before)
_LEN = struct.Struct("<I")
_MAC = 32
MAX_HEADER = 1 << 16
_PIECE = 4 << 20


def seal_header(secret: bytes, header: Mapping[str, Any]) -> bytes:
    """A transfer's header frame: length, JSON, HMAC of the JSON."""
    raw = json.dumps(header, sort_keys=True).encode()
    return _LEN.pack(len(raw)) + raw + hmac.digest(secret, raw, hashlib.sha256)


def image_mac(secret: bytes, header_frame: bytes | bytearray, image: bytes | bytearray) -> bytes:
    """The image's keyed digest, bound to its header (``seal_header``'s frame, whose last bytes are its MAC)."""
    mac = hmac.new(secret, b"mlaunch-replica-image\0" + bytes(header_frame[-_MAC:]), hashlib.sha256)
    mac.update(image)  # OpenSSL, the GIL released: the training's threads go on meanwhile
    return mac.digest()


def read_exact(sock: socket.socket, n: int, into: bytearray | None = None) -> bytearray | None:
    """``n`` bytes from ``sock`` (None when it closed first), into ``into`` when it is ``n`` long."""
    buf = into if into is not None and len(into) == n else bytearray(n)
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


def open_header(secret: bytes, sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
    """The next verified header on ``sock`` and its MAC (None: closed, too long, or not sealed with the secret)."""
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
    return (header, mac) if isinstance(header, dict) else None


class ReplicaStore:
    """Slots other nodes streamed here: (attempt, rank) → step → image, the newest and the anchor of each."""

    def __init__(self, secret: bytes, bind: str = "0.0.0.0") -> None:
        self.secret = secret
        self._lock = threading.Lock()
        self._slots: dict[tuple[int, int], dict[int, bytearray]] = {}
        self._meta: dict[tuple[int, int], dict[str, Any]] = {}
        # (attempt, rank) → an image that aged out, received into again: a fresh buffer's pages fault in
        # zero-filled on the copy, as much CPU again as the copy. Never one ``image`` handed out (``_lent``).
        self._spare: dict[tuple[int, int], bytearray] = {}
        self._lent: set[int] = set()
        self.messages: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.received_bytes = 0
        self.refused = 0  # slots whose digest did not match (tampered or torn in transit): never stored
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
            image = self._slots.get((attempt, rank), {}).get(step)
            if image is not None:
                self._lent.add(id(image))  # the survivors' save may write it out: never received into again
            return image

    def newest(self) -> dict[int, int]:
        """rank → the newest step held (any attempt's newest), for ``mlaunch status``."""
        with self._lock:
            newest_attempt = max((a for a, _ in self._slots), default=-1)
            return {r: max(s) for (a, r), s in self._slots.items() if a == newest_attempt and s}

    def bytes_held(self) -> int:
        """The memory the store holds: its slots, and the buffers it receives the next ones into."""
        with self._lock:
            spare = sum(len(b) for b in self._spare.values())
            return spare + sum(len(b) for s in self._slots.values() for b in s.values())

    def drop_before(self, attempt: int) -> None:
        """Forget slots of attempts before ``attempt`` (their generation is over and its save done)."""
        with self._lock:
            for key in [k for k in self._slots if k[0] < attempt]:
                for image in self._slots.pop(key).values():
                    self._lent.discard(id(image))
                self._meta.pop(key, None)
            for key in [k for k in self._spare if k[0] < attempt]:
                del self._spare[key]

    def put(
        self, attempt: int, rank: int, step: int, image: bytearray, meta: Mapping[str, Any], anchor: int | None = None
    ) -> None:
        """Hold ``image`` as the newest of (attempt, rank); keep beside it only ``anchor`` (else the one before)."""
        with self._lock:
            slots = self._slots.setdefault((attempt, rank), {})
            slots[step] = image
            keep = keep_after(slots, anchor, step)
            for old in [s for s in slots if s not in keep]:
                self._recycle((attempt, rank), slots.pop(old))
            self._meta[(attempt, rank)] = dict(meta)

    def _recycle(self, key: tuple[int, int], image: bytearray) -> None:
        """An image no slot holds any more: the next one of ``key`` is received into it (under the lock)."""
        if id(image) in self._lent:
            self._lent.discard(id(image))
        else:
            self._spare.setdefault(key, image)

    def _take_spare(self, key: tuple[int, int]) -> bytearray | None:
        with self._lock:
            return self._spare.pop(key, None)

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
                opened = open_header(self.secret, conn)
                if opened is None:
                    return
                header, header_mac = opened
                length, key = int(header["length"]), (int(header["attempt"]), int(header["rank"]))
                image = read_exact(conn, length, into=self._take_spare(key))
                digest = read_exact(conn, _MAC) if image is not None else None
                if image is None or digest is None:
                    return
                if not hmac.compare_digest(image_mac(self.secret, header_mac, image), bytes(digest)):
                    self.refused += 1
                    self.messages.put(
                        f"replica store: refused rank {header.get('rank')}'s step {header.get('step')} from node "
                        f"{header.get('node')}: its bytes do not match their keyed digest (tampered or torn in transit)"
                    )
                    with self._lock:
                        self._recycle(key, image)
                    conn.sendall(b"\x00")
                    return  # a stream that lies once is not read further
                if shardfile.image_size(image[: min(length, 1 << 16)]) != length:
                    self.messages.put(f"replica store: rank {header.get('rank')}'s image is not a whole shard")
                    with self._lock:
                        self._recycle(key, image)
                    conn.sendall(b"\x00")
                    continue
                self.received_bytes += length
                meta = {"world": int(header["world"]), "sharded": bool(header.get("sharded")), "node": header["node"]}
                anchor = header.get("anchor")
                step = int(header["step"])
                self.put(key[0], key[1], step, image, meta, None if anchor is None else int(anchor))
                conn.sendall(b"\x01")
