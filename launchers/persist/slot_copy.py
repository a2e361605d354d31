"""Copy a staged slot out of a live rank's shared-memory segment, never a torn one.

The background persist (``background_persist``) reads segments whose ranks are alive and keep
staging: a slot it wants can be overwritten by the rank's next-but-one ``stage()`` at any
moment. So the slot's bytes are copied into this process's memory first (fast: a memory
copy) and trusted only if the slot's sequence number was even and unchanged before and after
the copy (``staging``'s seqlock); the slow write to storage then works on the private copy.

Everything is read with ``pread`` on a file descriptor, never through a mapping (a mapping
whose file shrinks kills the reader with SIGBUS; ``pread`` just returns short). A rank whose
state grew builds a new segment and renames it over the old one (``staging.Segment._open``):
each poll follows the name to the newest file (``LiveSegment.header``).
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from dataclasses import dataclass

from launchers.elastic.format import shardfile
from launchers.elastic.ipc import staging

# staging's segment layout (see launchers.elastic.ipc.staging): header fields, slots, directory
_FIXED = staging._FIXED
_SLOT = staging._SLOT
_SLOTS_AT = staging._SLOTS_AT
_STRIDE = staging._SLOT_STRIDE
_DIR_AT = staging._DIR_AT
_HEAD = staging._DIR_AT + 2 + staging._DIR_MAX
_CHUNK = 1 << 30  # one preadv at most (Linux moves ≤ 2 GiB − 4 KiB per call)


class Torn(RuntimeError):
    """The slot changed (or the segment was re-created) while it was being copied."""


@dataclass(frozen=True)
class Header:
    """What one poll reads of a segment: its layout, target directory and slots."""

    rank: int
    world: int
    attempt: int
    capacity: int
    keep: int
    ckpt_dir: str
    slots: tuple[staging.Slot, ...]

    def complete(self, attempt: int) -> dict[int, staging.Slot]:
        """step → slot of the complete slots staged in ``attempt``."""
        return {s.step: s for s in self.slots if s.complete and s.attempt == attempt}


class LiveSegment:
    """A read-only descriptor on one rank's segment (``None`` header until the rank staged)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        self._inode = os.fstat(self.fd).st_ino

    def header(self) -> Header | None:
        self._follow()
        raw = os.pread(self.fd, _HEAD, 0)
        if len(raw) < _HEAD:
            return None  # being re-created, or not yet written
        magic, _v, _h, rank, world, attempt, _pid, capacity, nslots, keep = _FIXED.unpack_from(raw, 0)
        if magic != staging.MAGIC or nslots != staging.NSLOTS:
            return None
        (dlen,) = struct.unpack_from("<H", raw, _DIR_AT)
        ckpt_dir = raw[_DIR_AT + 2 : _DIR_AT + 2 + dlen].decode(errors="replace")
        slots = tuple(staging.Slot(i, *_SLOT.unpack_from(raw, _SLOTS_AT + i * _STRIDE)) for i in range(nslots))
        return Header(rank, world, attempt, capacity, keep, ckpt_dir, slots)

    def _follow(self) -> None:
        """Read the file that has the segment's name now: a rank whose state grew renamed a new one over it."""
        try:
            inode = os.stat(self.path).st_ino
        except OSError:
            return  # unlinked: the attempt is over, the open file still reads as it was
        if inode == self._inode:
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDONLY)
            os.close(self.fd)
            self.fd, self._inode = fd, os.fstat(fd).st_ino

    def seq(self, index: int) -> int:
        raw = os.pread(self.fd, 8, _SLOTS_AT + index * _STRIDE)
        return int(struct.unpack("<Q", raw)[0]) if len(raw) == 8 else -1

    def copy(self, head: Header, slot: staging.Slot, into: bytearray | None = None) -> bytearray:
        """The slot's shard image, copied out; ``Torn`` when it was not stable during the copy.

        ``into``: a buffer of the slot's length to reuse (the copy of an older step nobody needs
        any more). A fresh 64 MiB buffer costs the kernel's zero-filled pages faulting in on the
        copy: as much CPU again as the copy itself.
        """
        if slot.seq % 2 or self.seq(slot.index) != slot.seq:
            raise Torn(f"rank {head.rank}'s slot of step {slot.step} is being rewritten")
        buf = into if into is not None and len(into) == slot.length else bytearray(slot.length)
        view = memoryview(buf)
        start = staging.HEADER_SIZE + slot.index * head.capacity
        done = 0
        try:
            while done < slot.length:
                got = os.preadv(self.fd, [view[done : done + _CHUNK]], start + done)
                if got <= 0:
                    raise Torn(f"rank {head.rank}'s segment shrank while step {slot.step} was copied")
                done += got
        finally:
            view.release()
        again = self.header()
        if self.seq(slot.index) != slot.seq or again is None or again.capacity != head.capacity:
            raise Torn(f"rank {head.rank}'s slot of step {slot.step} changed while it was copied")
        try:
            if shardfile.image_size(buf[: min(slot.length, 1 << 16)]) != slot.length:
                raise Torn(f"rank {head.rank}'s slot of step {slot.step} does not hold a whole shard")
        except ValueError as exc:
            raise Torn(f"rank {head.rank}'s slot of step {slot.step}: {exc}") from None
        return buf

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


def open_ranks(run_id: str, ranks: set[int], have: dict[int, LiveSegment]) -> dict[int, LiveSegment]:
    """``have`` plus a descriptor for each of ``ranks``' segments that appeared since (rank from the name)."""
    for path in staging.run_segments(run_id):
        suffix = path.rsplit(".rank", 1)[-1]
        if not suffix.isdigit() or int(suffix) not in ranks or int(suffix) in have:
            continue
        with contextlib.suppress(OSError):
            have[int(suffix)] = LiveSegment(path)
    return have


def write_image(path: str, data: bytearray, cancelled: threading.Event) -> int:
    """Write ``data`` to ``path`` and fsync it, in 16 MiB pieces, giving up when ``cancelled`` is set.

    A failure or stop wants the disk for the dying
    checkpoint, so a background write gives up between two pieces (the caller discards it).
    """
    piece = 16 << 20
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        try:
            done = 0
            while done < len(data):
                if cancelled.is_set():
                    raise InterruptedError("cancelled")
                done += os.write(fd, view[done : done + piece])
        finally:
            view.release()
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(data)
