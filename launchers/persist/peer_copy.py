"""The owner's side of machine-loss replication: stream this node's newest staged slots to its buddy.

A machine that dies takes its shared memory with it, and with it the only copy of its ranks'
staged shards when the state is sharded (FSDP2, TP). So after each ``stage()`` this node's
mlaunch copies the newest step every local rank staged out of shared memory (``slot_copy``:
trusted only if the slot's sequence number was even and unchanged before and after — the rank
never waits, it never takes a lock) and sends it to the next node of the ring
(``replica_plan.ring``) on a TCP connection of its own (``replica_store``).

It never blocks training and never queues: while a copy is on the wire the ranks go on
staging, and the next copy takes a newer step; the steps in between are skipped and counted.
Which step is agreed with the other nodes' streams, round by round, through the control plane
(``replica_plan.round_of``): every node sends the same steps, so whatever one node's buddy holds,
the others kept their own shards of it. A buddy that is slow or unreachable costs this thread
time, not the ranks; it slows every node's rounds, so a loss costs more steps, never all since
the last commit. On the wire the stream is marked low priority (``low_priority``), so a link
that carries the training's collectives too gives them precedence.

It also keeps copies of what it sent (``retained``): the round's anchor (the newest step every
node kept, ``replica_plan.keep_after``) and the newest. If its buddy is the node that is lost,
the survivors' commit needs this node's own shards of the step the lost node's copies are of,
and the ranks' shared memory may have moved past it.

With ``checkpoint.replicate: auto`` it stops after the first slot when the state holds no
DTensor slice (DDP: every rank has the same bytes, the survivors need no copy).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launchers.control.reductions import local
from launchers.elastic.format import shardfile
from launchers.elastic.ipc.staging import Slot
from launchers.persist import replica_store
from launchers.persist.replica_plan import ROUND_HOW, Round, keep_after, round_of, round_offer
from launchers.persist.slot_copy import Header, LiveSegment, Torn, open_ranks

POLL = 0.01  # seconds between looks at the slots
RETRY = 0.5  # after a failed connection
SEND_TIMEOUT = 30.0  # a buddy that takes no byte for this long is given up (reconnect)
RETAIN = 2  # copies kept of what was sent: the anchor and the newest
LAG_WARN = RETAIN  # steps a copy may arrive behind the newest staged one before it is said
Agree = Callable[[int, Mapping[str, Any], threading.Event], Mapping[str, Any]]
"""``(round, this node's offer, stop)`` → every node's offer reduced by ``ROUND_HOW`` (ExchangeFailed: none)."""


def is_sharded(image: bytearray | bytes) -> bool:
    """Does this shard image hold DTensor slices (FSDP2, TP) — state no other rank holds?"""
    hlen, _ = shardfile.read_prefix(image)
    start = shardfile.PREFIX.size
    return b'"dtensor"' in bytes(image[start : start + hlen])


def low_priority(sock: socket.socket) -> None:
    """Mark the stream as less than best effort: DSCP CS1 and the kernel's filler priority.

    The copy must yield to the training's own collectives on a shared link: a network that
    honours it (switch QoS or a ``tc`` filter on DSCP; ``pfifo_fast``/``prio`` put priority 1 in
    their lowest band) carries it in the link's idle time. IP_TOS first: setting it resets the
    socket's priority.
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, 1)


@dataclass
class CopyStats:
    sent_steps: int = 0
    skipped_steps: int = 0
    sent_bytes: int = 0
    busy_seconds: float = 0.0
    last_sent: int = -1
    slot_bytes: int = 0  # one step of this node's ranks
    behind: int = 0  # steps the newest staged one was ahead of the copy that just arrived
    most_behind: int = 0
    rounds: int = 0  # rounds agreed with the other nodes
    anchor: int = -1  # the newest step every node's buddy holds (what a loss falls back to at worst)


class PeerCopy:
    """One attempt's stream of this node's staged slots to ``buddy`` (host, port); a thread."""

    def __init__(
        self,
        run_id: str,
        attempt: int,
        node: int,
        ranks: set[int],
        buddy: tuple[str, int],
        secret: bytes,
        mode: str,
        agree: Agree | None = None,
    ) -> None:
        """``agree``: the rounds' reduction across the nodes (the control plane's exchange); None: this node alone."""
        self.run_id, self.attempt, self.node, self.ranks = run_id, attempt, node, ranks
        self.buddy, self.secret, self.mode = buddy, secret, mode
        self.agree = agree
        self.stats = CopyStats()
        self.sharded: bool | None = None
        self.world = 0
        self.retained: dict[int, dict[int, bytearray]] = {}  # rank → step → a copy sent (``keep_after`` prunes)
        self._spare: dict[int, bytearray] = {}  # rank → a retained copy that aged out, reused for the next copy
        self.messages: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._said_lag = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="mlaunch-peer-copy", daemon=True)

    def start(self) -> PeerCopy:
        self._thread.start()
        return self

    def stop(self, wait: float = 2.0) -> None:
        self._stop.set()
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(wait)

    def retained_steps(self) -> dict[int, list[int]]:
        with self._lock:
            return {r: sorted(s) for r, s in self.retained.items()}

    def bytes_held(self) -> int:
        """The memory the stream holds: the copies kept, and the buffers it copies the next steps into."""
        with self._lock:
            kept = sum(len(i) for s in self.retained.values() for i in s.values())
        return kept + sum(len(i) for i in list(self._spare.values()))

    def retained_images(self) -> dict[int, dict[int, bytearray]]:
        """rank → step → the copies kept of the last steps sent (read once the stream stopped)."""
        with self._lock:
            return {r: dict(s) for r, s in self.retained.items()}

    # -- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        segments: dict[int, LiveSegment] = {}
        said_error = False
        last_round = -1
        try:
            while not self._stop.wait(POLL):
                newest = self._newest(segments)
                if newest is None or newest <= last_round:
                    continue  # nothing staged since the last round
                agreed = self._round(newest)
                if agreed is None or self._stop.is_set():
                    continue
                last_round = agreed.step
                slots = self._slots_of(segments, agreed.step)
                images = self._copy(segments, slots) if slots else None
                if images is None:
                    continue  # the ranks staged past the round's step first: its anchor stays
                if self.sharded is None:
                    self.sharded = any(is_sharded(i) for i in images.values())
                    if self.mode == "auto" and not self.sharded:
                        return  # replicated state: the survivors already hold every byte
                try:
                    self._send(agreed, images)
                    said_error = False
                    self._note_lag(segments, agreed.step)
                except OSError as exc:
                    self._recycle(images)
                    self._drop_socket()
                    if not said_error and not self._stop.is_set():
                        said_error = True
                        self.messages.put(f"replication: cannot stream to {self.buddy[0]}:{self.buddy[1]}: {exc}")
                    self._stop.wait(RETRY)
        except Exception as exc:  # never take mlaunch down
            self.messages.put(f"replication stopped: {type(exc).__name__}: {exc}")
        finally:
            self._drop_socket()
            for seg in segments.values():
                seg.close()

    def _round(self, newest: int) -> Round | None:
        """The next round, agreed with every node (None: they could not agree this time; the next round tries)."""
        offer = round_offer(newest, self._kept())
        number = self.stats.rounds
        self.stats.rounds += 1  # a round that failed here may have been decided without this node: never reused
        try:
            if self.agree is None:
                reduced = local(ROUND_HOW, self.node, offer)
            else:
                reduced = self.agree(number, offer, self._stop)
        except RuntimeError as exc:  # ExchangeFailed: a node lost, the generation over, or a stream stuck
            if not self._stop.is_set():
                self.messages.put(f"replication: round {number} not agreed: {exc}")
            return None
        agreed = round_of(reduced)
        if self._stop.is_set():
            return None  # the survivors' save may read the copies kept: none is dropped any more
        self.stats.anchor = -1 if agreed.anchor is None else agreed.anchor
        self._prune(agreed.anchor)
        return agreed

    def _kept(self) -> list[int]:
        """The steps every local rank's sent copy is kept of (this node's part of the anchor)."""
        with self._lock:
            if not self.retained or set(self.retained) != self.ranks:
                return []
            return sorted(set.intersection(*(set(kept) for kept in self.retained.values())))

    def _prune(self, anchor: int | None, newest: int | None = None) -> None:
        """Drop the sent copies no loss can need any more (``keep_after``); their buffers take the next copies."""
        aged: dict[int, bytearray] = {}
        with self._lock:
            for rank, kept in self.retained.items():
                for step in sorted(set(kept) - keep_after(kept, anchor, newest)):
                    aged[rank] = kept.pop(step)
        self._recycle(aged)  # read after this thread stops only (``replication._capture``): never in use

    def _note_lag(self, segments: dict[int, LiveSegment], sent: int) -> None:
        """How far the copy that just arrived is behind the newest staged step; said once when it is too far.

        The rounds keep every node's copies of the same steps, so a slow stream no longer makes a
        loss fall back to the last commit; but a loss costs the steps since the round's anchor,
        and every node's rounds go at the slowest stream's pace. That must not be learnt at the loss.
        """
        newest = self._newest(segments)
        self.stats.behind = behind = 0 if newest is None else max(0, newest - sent)
        self.stats.most_behind = max(self.stats.most_behind, behind)
        if behind > LAG_WARN and not self._said_lag:
            self._said_lag = True
            self.messages.put(
                f"replication: the copy of step {sent} reached {self.buddy[0]}:{self.buddy[1]} when step {newest} "
                f"was staged ({behind} steps behind): copies take longer than {LAG_WARN} steps, so a node loss "
                f"would cost about {behind} steps (a faster link, fewer bytes per step, or slower steps help)"
            )

    def _slots_of(self, segments: dict[int, LiveSegment], step: int) -> dict[int, tuple[Header, Slot]] | None:
        """Each local rank's (header, slot) of ``step`` (None: a rank no longer holds it)."""
        found = {}
        for rank in self.ranks:
            seg = segments.get(rank)
            head = seg.header() if seg is not None else None
            slot = head.complete(self.attempt).get(step) if head is not None else None
            if head is None or slot is None:
                return None
            found[rank] = (head, slot)
        return found

    def _newest(self, segments: dict[int, LiveSegment]) -> int | None:
        """The newest step every local rank staged in this attempt (None: a rank has staged none yet)."""
        open_ranks(self.run_id, self.ranks, segments)
        heads = {}
        for rank in self.ranks:
            seg = segments.get(rank)
            head = seg.header() if seg is not None else None
            if head is None or not head.complete(self.attempt):
                return None
            heads[rank] = head
        common = set.intersection(*(set(h.complete(self.attempt)) for h in heads.values()))
        self.world = next(iter(heads.values())).world
        return max(common) if common else None

    def _copy(
        self, segments: dict[int, LiveSegment], slots: dict[int, tuple[Header, Slot]]
    ) -> dict[int, bytearray] | None:
        images: dict[int, bytearray] = {}
        for rank, (head, slot) in slots.items():
            try:
                images[rank] = segments[rank].copy(head, slot, into=self._spare.pop(rank, None))
            except Torn:
                self._recycle(images)
                return None  # the rank is already writing the next-but-one step: take the newest next time
        return images

    def _recycle(self, images: dict[int, bytearray]) -> None:
        """Copies nobody will read again: the next copy of the same rank goes into them (this thread only).

        Once the stream is told to stop, the survivors' save may hold any copy: none is reused.
        """
        if self._stop.is_set():
            return
        for rank, image in images.items():
            self._spare.setdefault(rank, image)

    def _connect(self) -> socket.socket:
        with self._lock:
            if self._sock is None:
                sock = socket.create_connection(self.buddy, timeout=SEND_TIMEOUT)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                low_priority(sock)
                self._sock = sock
            return self._sock

    def _drop_socket(self) -> None:
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()
                self._sock = None

    def _send(self, agreed: Round, images: dict[int, bytearray]) -> None:
        """Every local rank's image of the round's step to the buddy, each acknowledged once stored there."""
        started = time.monotonic()
        step = agreed.step
        sock = self._connect()
        for rank, image in sorted(images.items()):
            header = {
                "node": self.node,
                "attempt": self.attempt,
                "rank": rank,
                "step": step,
                "length": len(image),
                "world": self.world,
                "sharded": bool(self.sharded),
                "anchor": agreed.anchor,  # the buddy keeps it beside the newest
            }
            sealed = replica_store.seal_header(self.secret, header)
            sock.sendall(sealed)
            sock.sendall(image)
            sock.sendall(replica_store.image_mac(self.secret, sealed, image))  # checked before the buddy keeps it
        for _ in images:
            ack = replica_store.read_exact(sock, 1)
            if ack is None or ack != b"\x01":
                raise OSError("the buddy refused or dropped a slot")
        with self._lock:
            for rank, image in images.items():
                self.retained.setdefault(rank, {})[step] = image
        self._prune(agreed.anchor, step)
        stats = self.stats
        if stats.last_sent >= 0:
            stats.skipped_steps += max(0, step - stats.last_sent - 1)
        stats.last_sent = step
        stats.sent_steps += 1
        stats.slot_bytes = sum(len(i) for i in images.values())
        stats.sent_bytes += stats.slot_bytes
        stats.busy_seconds += time.monotonic() - started
