"""Per-rank shared-memory staging: the worker writes, the agent (mlaunch) reads after a fault.

One file per rank in ``/dev/shm`` (``$MLAUNCH_SHM_DIR`` overrides), named after the run so
mlaunch — and, if mlaunch is SIGKILLed, its watchdog — can find and unlink every segment of
the run: ``mlaunch.<run_id>.rank<R>``.

Layout: a 4 KiB header, then two *slots* of equal capacity. Each slot holds one complete
shard image (``shardfile``) of one step. The worker always writes into the slot that does
not hold its newest complete step, so killing it in the middle of a copy still leaves the
previous step intact. Every slot has a sequence number (a seqlock): odd while being
written, even when complete. A reader trusts a slot only if the number is even before and
after it copied the bytes, so a half-copied buffer is never persisted.

The header also carries what the agent needs without asking the worker: the checkpoint
directory and keep count the worker's ``Checkpointer`` uses, the restart attempt (slots of
an earlier attempt are never mixed with this one's), and status for the grace budget
(measured step time, last save's duration and size, the step being saved).

The space is reserved with ``posix_fallocate``: writing through a mapping into a full tmpfs
would kill the training process with SIGBUS; reserving first turns that into an ``OSError``
and staging switches itself off with a warning instead.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass

from launchers.elastic.format import shardfile
from launchers.elastic.ranks import env

MAGIC = b"MLSTAGE1"
HEADER_SIZE = 4096
NSLOTS = 2
# magic, version, header_size, rank, world, attempt, pid, capacity, nslots, keep
_FIXED = struct.Struct("<8sIIqqqqQIi")
# step_time, save_seconds, save_bytes, state_bytes, steps_seen, saving_step, committed_step, updated
_STATUS = struct.Struct("<ddQQqqqd")
_STATUS_AT = 128
# seq, step, length, stamp, attempt
_SLOT = struct.Struct("<QqQdq")
_SLOTS_AT = 256
_SLOT_STRIDE = 64
_DIR_AT = 512  # u16 length + utf-8 path of the checkpoint directory
_DIR_MAX = HEADER_SIZE - _DIR_AT - 2


def shm_dir() -> str:
    return env.shm_dir()


def segment_path(run_id: str, rank: int) -> str:
    return os.path.join(shm_dir(), f"mlaunch.{run_id}.rank{rank}")


def run_segments(run_id: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(shm_dir()), f"mlaunch.{glob.escape(run_id)}.rank*")))


def kept_path(run_id: str, rank: int) -> str:
    """Where rank ``rank``'s segment of the last attempt waits for the next one (``ipc.kept_segments``)."""
    return os.path.join(shm_dir(), f"mlaunch.{run_id}.kept.rank{rank}")


def kept_segments(run_id: str) -> list[str]:
    return glob.glob(os.path.join(glob.escape(shm_dir()), f"mlaunch.{glob.escape(run_id)}.kept.rank*"))


def unlink_kept(run_id: str) -> int:
    """Remove the segments ``run_id`` kept for its next attempt; how many."""
    removed = 0
    for path in kept_segments(run_id):
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed += 1
    return removed


def building_segments(run_id: str) -> list[str]:
    """Segments a killed rank left half-built under their hidden building names."""
    return glob.glob(os.path.join(glob.escape(shm_dir()), f".mlaunch.{glob.escape(run_id)}.rank*.new"))


def _building_path(path: str) -> str:
    """Where a segment is built before it takes ``path``'s name: hidden, so ``run_segments`` never lists it."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{os.getpid()}.new")


def unlink_run(run_id: str) -> int:
    """Remove every segment of ``run_id`` (and any a killed rank left half-built); returns how many.

    Not the segments kept for the next attempt (``ipc.kept_segments``): ``unlink_kept`` removes those.
    Retired ones (``run.shm_reclaim.retire``) a killed mlaunch left unlinked go too.
    """
    removed = 0
    retired = glob.glob(os.path.join(glob.escape(shm_dir()), f".mlaunch.{glob.escape(run_id)}.*.retired"))
    for path in [*run_segments(run_id), *building_segments(run_id), *retired]:
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed += 1
    return removed


@dataclass
class Status:
    step_time: float = 0.0
    save_seconds: float = 0.0
    save_bytes: int = 0
    state_bytes: int = 0
    steps_seen: int = 0
    saving_step: int = -1
    committed_step: int = -1
    updated: float = 0.0


@dataclass(frozen=True)
class SlotWrite:
    """A slot being written: its index, its odd sequence number, where its bytes start, the image's size."""

    index: int
    seq: int
    data_at: int
    size: int


@dataclass
class Slot:
    index: int
    seq: int
    step: int
    length: int
    stamp: float
    attempt: int

    @property
    def complete(self) -> bool:
        return self.seq > 0 and self.seq % 2 == 0 and self.length > 0


# ----------------------------------------------------------------------------------------
# Worker side
# ----------------------------------------------------------------------------------------


class Segment:
    """This process's segment (created on first use, grown when the state grows)."""

    def __init__(self, path: str, rank: int, world: int, attempt: int) -> None:
        self.path = path
        self.rank = rank
        self.world = world
        self.attempt = attempt
        self.capacity = 0
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self.ckpt_dir = ""
        self.keep = 0
        self.in_flight: threading.Thread | None = None  # a write to a slot on another thread (device copies)

    # -- lifecycle ---------------------------------------------------------------------
    def _open(self, capacity: int) -> None:
        """(Re)create the file with ``capacity`` per slot and map it; OSError if no space.

        The new file is built under a hidden name and renamed over the old one, never truncated
        in place: mlaunch's agent may have the old one mapped (``SegmentReader``), and a mapping
        whose file shrinks under it dies of SIGBUS on its next read — a 300-fault storm lost
        node 0's mlaunch that way when a rank's state grew. Readers keep the old inode, whole.
        """
        self.close()
        capacity = -(-capacity // mmap.PAGESIZE) * mmap.PAGESIZE  # slots start on page boundaries
        total = HEADER_SIZE + NSLOTS * capacity
        building = _building_path(self.path)
        fd = os.open(building, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, total)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, total)
            mm = mmap.mmap(fd, total)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(building)
            raise
        self._fd, self._mm, self.capacity = fd, mm, capacity
        _FIXED.pack_into(
            mm, 0, MAGIC, 1, HEADER_SIZE, self.rank, self.world, self.attempt, os.getpid(), capacity, NSLOTS, self.keep
        )
        self._write_dir()
        os.rename(building, self.path)  # whole, header included, the moment a reader can find it

    def ensure(self, capacity: int) -> None:
        if self._mm is None or capacity > self.capacity:
            status = self.status() if self._mm is not None else Status()
            self._open(capacity)
            self.set_status(status)

    def close(self) -> None:
        self.settle()
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def set_target(self, ckpt_dir: str, keep: int) -> None:
        self.ckpt_dir, self.keep = ckpt_dir, keep
        if self._mm is not None:
            self._write_dir()
            struct.pack_into("<i", self._mm, _FIXED.size - 4, keep)

    def _write_dir(self) -> None:
        assert self._mm is not None
        raw = self.ckpt_dir.encode()[:_DIR_MAX]
        struct.pack_into("<H", self._mm, _DIR_AT, len(raw))
        self._mm[_DIR_AT + 2 : _DIR_AT + 2 + len(raw)] = raw

    # -- status ------------------------------------------------------------------------
    def status(self) -> Status:
        assert self._mm is not None
        return Status(*_STATUS.unpack_from(self._mm, _STATUS_AT))

    def set_status(self, status: Status) -> None:
        if self._mm is None:
            self.ensure(0)
        assert self._mm is not None
        status.updated = time.time()
        _STATUS.pack_into(
            self._mm,
            _STATUS_AT,
            status.step_time,
            status.save_seconds,
            status.save_bytes,
            status.state_bytes,
            status.steps_seen,
            status.saving_step,
            status.committed_step,
            status.updated,
        )

    # -- slots -------------------------------------------------------------------------
    def slots(self) -> list[Slot]:
        assert self._mm is not None
        return [Slot(i, *_SLOT.unpack_from(self._mm, _SLOTS_AT + i * _SLOT_STRIDE)) for i in range(NSLOTS)]

    def stage(self, step: int, enc: shardfile.Encoded) -> None:
        """Copy ``enc`` into the slot that does not hold the newest complete step."""
        write = self.begin(enc.size)
        view = self.slot_memory(write)
        try:
            shardfile.write_into(view, enc)
        finally:
            view.release()
        self.publish(write, step)

    def begin(self, size: int) -> SlotWrite:
        """Choose the slot for a ``size``-byte image and mark it being written (its seqlock odd).

        A reader keeps trusting the other slot, the newest complete step, until ``publish``.
        A copy still in flight (``in_flight``, the device copies' writer) is waited for first.
        """
        self.settle()
        if self._mm is None or size > self.capacity:
            self.ensure(size + size // 4 + (1 << 20))  # head-room: states grow a little
        assert self._mm is not None
        slots = self.slots()
        complete = [s for s in slots if s.complete]
        newest = max(complete, key=lambda s: (s.step, s.seq), default=None)
        target = next((s for s in slots if newest is None or s.index != newest.index), slots[0])
        seq = target.seq + 1 if target.seq % 2 == 0 else target.seq + 2
        struct.pack_into("<Q", self._mm, _SLOTS_AT + target.index * _SLOT_STRIDE, seq)  # odd while writing
        return SlotWrite(target.index, seq, HEADER_SIZE + target.index * self.capacity, size)

    def slot_memory(self, write: SlotWrite) -> memoryview:
        assert self._mm is not None
        return memoryview(self._mm)[write.data_at : write.data_at + write.size]

    def publish(self, write: SlotWrite, step: int) -> None:
        """The slot's fields, then its seqlock even: from now on a reader may persist ``step``."""
        assert self._mm is not None
        at = _SLOTS_AT + write.index * _SLOT_STRIDE
        _SLOT.pack_into(self._mm, at, write.seq, step, write.size, time.time(), self.attempt)
        struct.pack_into("<Q", self._mm, at, write.seq + 1)

    def settle(self) -> None:
        """Wait for the slot write in flight on another thread, if any (nothing is unmapped under it)."""
        if self.in_flight is not None:
            self.in_flight.join()
            self.in_flight = None

    def forget(self) -> None:
        """Invalidate every slot (nothing staged any more: the agent must not persist an old step)."""
        self.settle()
        if self._mm is None:
            return
        for index in range(NSLOTS):
            at = _SLOTS_AT + index * _SLOT_STRIDE
            (seq,) = struct.unpack_from("<Q", self._mm, at)
            struct.pack_into("<Q", self._mm, at, seq | 1)  # odd: "being written" to any reader
            _SLOT.pack_into(self._mm, at, seq | 1, -1, 0, time.time(), self.attempt)
            struct.pack_into("<Q", self._mm, at, 0)


# ----------------------------------------------------------------------------------------
# Agent side (mlaunch): read-only views of a run's segments
# ----------------------------------------------------------------------------------------


@dataclass
class SegmentInfo:
    path: str
    rank: int
    world: int
    attempt: int
    pid: int
    capacity: int
    keep: int
    ckpt_dir: str
    status: Status
    slots: list[Slot]


class SegmentReader:
    """A read-only mapping of one segment, for the agent."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)  # kept open: slots are copied out with sendfile
        try:
            size = os.fstat(self.fd).st_size
            if size < HEADER_SIZE:
                raise shardfile.ShardFormatError(f"{path}: too small to be a staging segment")
            self._mm = mmap.mmap(self.fd, size, prot=mmap.PROT_READ)
        except BaseException:
            os.close(self.fd)
            raise
        magic, _v, _h, rank, world, attempt, pid, capacity, nslots, keep = _FIXED.unpack_from(self._mm, 0)
        if magic != MAGIC or nslots != NSLOTS:
            self._mm.close()
            os.close(self.fd)
            raise shardfile.ShardFormatError(f"{path}: not a staging segment")
        (dlen,) = struct.unpack_from("<H", self._mm, _DIR_AT)
        ckpt_dir = bytes(self._mm[_DIR_AT + 2 : _DIR_AT + 2 + dlen]).decode(errors="replace")
        self.info = SegmentInfo(path, rank, world, attempt, pid, capacity, keep, ckpt_dir, self.status(), self.slots())

    def status(self) -> Status:
        return Status(*_STATUS.unpack_from(self._mm, _STATUS_AT))

    def slots(self) -> list[Slot]:
        return [Slot(i, *_SLOT.unpack_from(self._mm, _SLOTS_AT + i * _SLOT_STRIDE)) for i in range(NSLOTS)]

    def seq(self, index: int) -> int:
        (seq,) = struct.unpack_from("<Q", self._mm, _SLOTS_AT + index * _SLOT_STRIDE)
        return int(seq)

    def offset(self, slot: Slot) -> int:
        """Where ``slot``'s data starts in the segment file."""
        return HEADER_SIZE + slot.index * self.info.capacity

    def data(self, slot: Slot) -> memoryview:
        start = self.offset(slot)
        return memoryview(self._mm)[start : start + slot.length]

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_run(run_id: str) -> list[SegmentInfo]:
    """Header snapshots of every segment of the run (unreadable ones are skipped)."""
    infos = []
    for path in run_segments(run_id):
        try:
            with SegmentReader(path) as reader:
                infos.append(reader.info)
        except (OSError, ValueError):
            continue
    return infos
