"""Staging state that lives in accelerator memory without stalling training.

Why: a tensor on a GPU (or an Ascend NPU) reached shared memory through a synchronous
``t.cpu()`` per tensor — pageable memory, one blocking copy each, then a second copy into
the slot. For gigabytes of FSDP2 state that is seconds of stall per ``stage()``, where
TorchTitan's async checkpointing and DLRover's flash checkpoint copy into pinned memory and
let training go on. Here a step is staged so (``DeviceStager.stage``):

1. the previous step's write is waited for: it owns the one pinned buffer and a slot;
2. the slot is chosen and marked being written (its seqlock odd): until step 6 a reader —
   mlaunch's flash save — keeps trusting the other slot, the newest complete step;
3. host blobs (the RNG state, counters, arrays) are copied into the pinned buffer now, since
   the next step may change them; device blobs are copied on a side stream that first waits
   for the work already queued on the compute stream, so it reads the step just finished;
4. an event is recorded after the copies, and the compute stream waits for it — a wait on
   the device, so the CPU goes on at once. By default the compute stream waits before its
   next kernel (safe for any state: nothing can change a tensor before it is copied); with
   ``overlap`` it waits at the next ``optimizer.step()``, so the copy also overlaps the next
   forward and backward (only for states that nothing else changes in place: BatchNorm's
   running statistics in train mode do);
5. ``stage`` returns; a writer thread waits for the event, copies header and pinned bytes
   into the slot (``memmove``, without the GIL, in a few threads), and only then
6. publishes the slot.

Pinned memory: one buffer per rank, of the image's data size plus a quarter (at most the
slot's capacity), allocated on the first stage and again only when the state outgrows it.
A process killed before step 6 leaves the previous step for the flash save: one more step
lost, never a torn one. A normal exit (and ``Guard.exit``) waits for the write in flight.

The copies themselves are behind ``CopyEngine`` (``TorchCopies`` for CUDA and NPU); the
ordering above is the same for any engine and is tested on CPU with a stand-in engine.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from launchers.elastic.format import shardfile
from launchers.elastic.ipc import staging

PARALLEL_COPY_FROM = 64 << 20  # bytes: above this the host copy into the slot runs in COPY_THREADS threads
COPY_THREADS = max(1, min(8, (os.cpu_count() or 1) // 2))


class Ready(Protocol):
    """The recorded end of one step's device copies."""

    def wait(self) -> None: ...


@dataclass
class HostMemory:
    """A host buffer the device copies land in: its address, size, and what keeps it alive."""

    address: int
    nbytes: int
    keep: Any


class CopyEngine(Protocol):
    """How bytes leave the device: pinned host memory, asynchronous copies, an event, a fence."""

    def host_buffer(self, nbytes: int) -> HostMemory: ...

    def copy_async(self, host: HostMemory, offset: int, tensor: Any) -> None: ...

    def record(self) -> Ready: ...

    def fence(self, ready: Ready) -> None: ...


@dataclass
class _Write:
    """One step on its way into a slot: published by the writer thread, or failed with ``error``."""

    segment: staging.Segment
    slot: staging.SlotWrite
    step: int
    header: bytes
    data_start: int
    data_size: int
    host: HostMemory
    ready: Ready
    keep: list[Any]  # the device tensors: alive until their copy has finished
    started: float  # when ``stage`` began queueing it (after waiting for the write before)
    error: BaseException | None = None
    copied: float = 0.0  # when the device copies had finished (the event)
    published: float = 0.0


@dataclass
class DeviceStager:
    """One per process: the pinned buffer, the copy engine and the write in flight."""

    engine: CopyEngine
    host: HostMemory | None = None
    allocations: int = 0  # how many pinned buffers were allocated (1 unless the state outgrew it)
    waited: float = 0.0  # seconds ``stage`` waited for the previous write (the stall beyond enqueueing)
    to_slot: float = 0.0  # seconds from the last published step's ``stage`` call to its slot's publication
    off_device: float = 0.0  # of which: until its device copies had finished
    current: _Write | None = None

    def stage(self, segment: staging.Segment, step: int, enc: shardfile.Encoded) -> None:
        """Start staging ``enc`` as ``step`` into ``segment``; returns once the copies are queued.

        Raises ``OSError`` when the previous write failed (staging then turns itself off) and
        whatever the slot's reservation raises (a full ``/dev/shm``).
        """
        self.wait()
        called = time.monotonic()
        host = self._buffer(enc.data_size)
        slot = segment.begin(enc.size)
        start = enc.data_start
        memory = memoryview((ctypes.c_ubyte * host.nbytes).from_address(host.address)).cast("B")
        for index, (blob, view) in enumerate(zip(enc.blobs, enc.views, strict=True)):
            if index in enc.on_device:
                self.engine.copy_async(host, blob.offset, enc.on_device[index])
            elif view.nbytes:
                memory[blob.offset : blob.offset + view.nbytes] = view
        ready = self.engine.record()
        self.engine.fence(ready)
        keep = list(enc.keepalive)  # the device tensors among them: alive until their copy has finished
        write = _Write(segment, slot, step, enc.prefix_and_header, start, enc.data_size, host, ready, keep, called)
        thread = threading.Thread(target=_write_slot, args=(write,), name="mlaunch-stage-write", daemon=True)
        self.current = write
        segment.in_flight = thread
        thread.start()

    def wait(self) -> None:
        """Until the write in flight is published; ``OSError`` if it failed."""
        write, self.current = self.current, None
        if write is None:
            return
        started = time.monotonic()
        write.segment.settle()
        self.waited += time.monotonic() - started
        if write.published:
            self.to_slot = write.published - write.started
            self.off_device = write.copied - write.started
        if write.error is not None:
            raise OSError(f"copying step {write.step} from the device failed: {write.error}") from write.error

    def _buffer(self, nbytes: int) -> HostMemory:
        if self.host is None or self.host.nbytes < nbytes:
            self.host = None  # the old buffer goes before the new one is pinned
            self.host = self.engine.host_buffer(max(nbytes + nbytes // 4, 1))
            self.allocations += 1
        return self.host


def _write_slot(write: _Write) -> None:
    """The writer thread: the event, then the bytes into the slot, then — only then — the slot published."""
    try:
        write.ready.wait()
        write.copied = time.monotonic()
        write.keep.clear()  # the copies are done: the device tensors may go
        memory = write.segment.slot_memory(write.slot)
        try:
            memory[: len(write.header)] = write.header
            target = ctypes.c_char.from_buffer(memory, write.data_start)
            try:
                _copy(ctypes.addressof(target), write.host.address, write.data_size)
            finally:
                del target
        finally:
            memory.release()
        write.segment.publish(write.slot, write.step)
        write.published = time.monotonic()
    except BaseException as exc:  # noqa: BLE001 - reported by the next stage on the training thread
        write.error = exc


def _copy(destination: int, source: int, nbytes: int) -> None:
    """``memmove`` (the GIL released: ctypes releases it for foreign calls), split over threads when large."""
    if nbytes < PARALLEL_COPY_FROM:
        ctypes.memmove(destination, source, nbytes)
        return
    piece = -(-nbytes // COPY_THREADS)
    threads = [
        threading.Thread(target=ctypes.memmove, args=(destination + at, source + at, min(piece, nbytes - at)))
        for at in range(0, nbytes, piece)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# ----------------------------------------------------------------------------------------
# The torch engine: CUDA, and NPU where torch_npu registers it
# ----------------------------------------------------------------------------------------


@dataclass
class _Events:
    events: list[tuple[Any, Any]]  # (device, event) per device copied from

    def wait(self) -> None:
        for _device, event in self.events:
            event.synchronize()  # releases the GIL while the copy engine works


class TorchCopies:
    """Device-to-host copies with torch: a side stream per device, pinned memory, events."""

    def __init__(self, overlap: bool = False) -> None:
        self.torch = sys.modules["torch"]
        self.overlap = overlap
        self.streams: dict[Any, Any] = {}
        self.started: list[Any] = []  # devices copied from since the last record()
        self.pending: _Events | None = None  # overlap: fenced at the next optimizer step
        self._hooked = False

    def _module(self, device: Any) -> Any:
        return self.torch.get_device_module(device.type)

    def host_buffer(self, nbytes: int) -> HostMemory:
        buffer = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True)
        return HostMemory(int(buffer.data_ptr()), nbytes, buffer)

    def copy_async(self, host: HostMemory, offset: int, tensor: Any) -> None:
        device = tensor.device
        module = self._module(device)
        side = self.streams.get(device)
        if side is None:
            side = self.streams[device] = module.Stream(device=device)
        if device not in self.started:
            side.wait_stream(module.current_stream(device))  # read the step the compute stream just finished
            self.started.append(device)
        source = tensor.reshape(-1).view(self.torch.uint8)
        with module.stream(side):
            host.keep[offset : offset + source.numel()].copy_(source, non_blocking=True)

    def record(self) -> Ready:
        events = []
        for device in self.started:
            event = self._module(device).Event()
            event.record(self.streams[device])
            events.append((device, event))
        self.started = []
        return _Events(events)

    def fence(self, ready: Ready) -> None:
        assert isinstance(ready, _Events)
        if not self.overlap:
            self._wait_on_device(ready)
            return
        self.pending = ready
        if not self._hooked:
            hooks = importlib.import_module("torch.optim.optimizer")  # every torch.optim optimizer's step
            hooks.register_optimizer_step_pre_hook(self._before_optimizer_step)
            self._hooked = True

    def _before_optimizer_step(self, *_args: Any) -> None:
        ready, self.pending = self.pending, None
        if ready is not None:
            self._wait_on_device(ready)

    def _wait_on_device(self, ready: _Events) -> None:
        for device, event in ready.events:
            self._module(device).current_stream(device).wait_event(event)


# ----------------------------------------------------------------------------------------
# The process's stager
# ----------------------------------------------------------------------------------------

_stager: DeviceStager | None = None


def process_stager(overlap: bool = False) -> DeviceStager:
    """This process's stager (the torch engine), created on the first device stage."""
    global _stager
    if _stager is None:
        _stager = DeviceStager(TorchCopies(overlap))
        atexit.register(_finish)
    engine = _stager.engine
    if isinstance(engine, TorchCopies):
        engine.overlap = overlap
    return _stager


def _finish() -> None:
    """At exit: the step in flight reaches its slot before the process is gone."""
    if _stager is not None:
        with contextlib.suppress(OSError):
            _stager.wait()
