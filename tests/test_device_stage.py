"""Staging from accelerator memory: a slot is published only after its copy finished, one pinned buffer.

CUDA cannot exist on this machine, so the copy engine is a stand-in (``HeldCopies``): its "device"
tensors are CPU tensors whose bytes it copies into the host buffer only when the test lets the copy
finish — what a copy on a side stream looks like to the host. Everything else is real: the encoder,
the shared-memory segment (a file under ``tmp_path``), the writer thread, the seqlock a reader
trusts, and the reader mlaunch's flash save uses (``SegmentReader``). The torch engine itself runs
on a GPU in ``benchmarks/device_stage.py`` (figures in docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import dataclasses
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from launchers.elastic.format import shardfile
from launchers.elastic.ipc import device_stage, staging

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


class _Held:
    """The end of one step's copies: they land in host memory when the test releases them."""

    def __init__(self, copies: list[tuple[device_stage.HostMemory, int, Any]], fail: bool) -> None:
        self.copies, self.fail = copies, fail
        self.release = threading.Event()

    def wait(self) -> None:
        assert self.release.wait(30), "the test never let the copy finish"
        if self.fail:
            raise RuntimeError("an illegal memory access was encountered")
        for host, offset, tensor in self.copies:
            data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
            ctypes.memmove(host.address + offset, data, len(data))


class HeldCopies:
    """A copy engine whose copies finish when the test says (stand-in for CUDA streams and events)."""

    def __init__(self) -> None:
        self.queued: list[tuple[device_stage.HostMemory, int, Any]] = []
        self.recorded: list[_Held] = []
        self.fenced: list[_Held] = []
        self.hold = False
        self.fail = False

    def host_buffer(self, nbytes: int) -> device_stage.HostMemory:
        buffer = (ctypes.c_ubyte * nbytes)()
        return device_stage.HostMemory(ctypes.addressof(buffer), nbytes, buffer)

    def copy_async(self, host: device_stage.HostMemory, offset: int, tensor: Any) -> None:
        self.queued.append((host, offset, tensor))

    def record(self) -> _Held:
        held = _Held(self.queued, self.fail)
        self.queued = []
        if not self.hold:
            held.release.set()
        self.recorded.append(held)
        return held

    def fence(self, ready: Any) -> None:
        self.fenced.append(ready)


def on_device(enc: shardfile.Encoded) -> shardfile.Encoded:
    """``enc`` as ``encode(on_device=True)`` makes it when its torch tensors are on an accelerator."""
    tensors = {
        i: keep for i, (blob, keep) in enumerate(zip(enc.blobs, enc.keepalive, strict=True)) if blob.kind == "torch"
    }
    views = [memoryview(b"") if i in tensors else view for i, view in enumerate(enc.views)]
    return dataclasses.replace(enc, views=views, on_device=tensors)


def state(step: int, size: int = 4096) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(size, generator=generator), "b": torch.arange(7, dtype=torch.int64) * step},
        "rng": np.array([step, step + 1], dtype=np.uint8),  # a host blob: copied when staged
        "step": step,
    }


def newest(segment_path: Path) -> tuple[int, Any] | None:
    """What mlaunch's flash save would persist: the newest complete slot's step and state (None: none)."""
    with staging.SegmentReader(str(segment_path)) as reader:
        complete = [slot for slot in reader.slots() if slot.complete]
        if not complete:
            return None
        slot = max(complete, key=lambda s: (s.step, s.seq))
        decoded, _meta = shardfile.decode(bytearray(reader.data(slot)))
        return slot.step, decoded


def equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return bool(a.dtype == b.dtype and np.array_equal(a, b))
    if isinstance(a, torch.Tensor):
        return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    return bool(a == b)


def stage(stager: device_stage.DeviceStager, segment: staging.Segment, step: int, values: Any = None) -> None:
    """Stage ``values`` (default ``state(step)``) as ``step``, its torch tensors as if on a device."""
    stager.stage(segment, step, on_device(shardfile.encode(state(step) if values is None else values)))


def assert_newest(segment: staging.Segment, step: int, expected: Any = None) -> None:
    """The flash save would persist ``step``, holding ``expected`` (default ``state(step)``)."""
    got = newest(Path(segment.path))
    assert got is not None and got[0] == step, got and got[0]
    assert equal(got[1], state(step) if expected is None else expected)


@pytest.fixture
def segment(tmp_path: Path) -> staging.Segment:
    seg = staging.Segment(str(tmp_path / "mlaunch.run.rank0"), 0, 1, 0)
    seg.set_target(str(tmp_path / "ckpt"), 2)
    yield seg
    seg.close()


def test_a_step_is_published_only_after_its_device_copy_finished(segment: staging.Segment) -> None:
    engine = HeldCopies()
    stager = device_stage.DeviceStager(engine)
    stage(stager, segment, 1)
    stager.wait()
    assert_newest(segment, 1)

    engine.hold = True
    stage(stager, segment, 2)
    assert engine.fenced == engine.recorded, "the compute stream must be fenced on every step's copies"
    # the copy of step 2 is still on its way: a flash save now persists step 1, whole
    assert_newest(segment, 1)
    engine.recorded[-1].release.set()
    stager.wait()
    assert_newest(segment, 2)


def test_host_values_are_taken_when_staged_not_when_the_copy_ends(segment: staging.Segment) -> None:
    engine = HeldCopies()
    engine.hold = True
    stager = device_stage.DeviceStager(engine)
    values = state(3)
    stage(stager, segment, 3, values)
    values["rng"] += 100  # the next step changes host state while the device copy is still going
    engine.recorded[-1].release.set()
    stager.wait()
    assert_newest(segment, 3)  # state(3): the rng as it was at stage()


def test_one_pinned_buffer_allocated_once_and_again_only_when_the_state_outgrows_it(segment: staging.Segment) -> None:
    stager = device_stage.DeviceStager(HeldCopies())
    for step in range(1, 9):
        stage(stager, segment, step)
    stager.wait()
    assert stager.allocations == 1
    first = stager.host
    assert first is not None and first.nbytes <= segment.capacity, "at most the slot's size of pinned memory"
    stage(stager, segment, 9, state(9, size=4096 * 3))
    stage(stager, segment, 10)
    stager.wait()
    assert stager.allocations == 2
    assert_newest(segment, 10)


def test_the_next_stage_waits_for_the_copy_in_flight(segment: staging.Segment) -> None:
    engine = HeldCopies()
    engine.hold = True
    stager = device_stage.DeviceStager(engine)
    stage(stager, segment, 1)
    timer = threading.Timer(0.3, engine.recorded[-1].release.set)
    timer.start()
    engine.hold = False
    stage(stager, segment, 2)  # must not take step 1's buffer under it
    stager.wait()
    assert stager.waited >= 0.2  # it waited for step 1's copy (released 0.3 s after it was queued)
    with staging.SegmentReader(segment.path) as reader:
        slots = {slot.step: slot for slot in reader.slots() if slot.complete}
        assert sorted(slots) == [1, 2]
        first, _meta = shardfile.decode(bytearray(reader.data(slots[1])))
    assert equal(first, state(1)), "step 2 was copied into the pinned buffer before step 1 had left it"
    assert_newest(segment, 2)


def test_a_failed_copy_keeps_the_previous_step_and_is_reported(segment: staging.Segment) -> None:
    engine = HeldCopies()
    stager = device_stage.DeviceStager(engine)
    stage(stager, segment, 1)
    engine.fail = True
    stage(stager, segment, 2)
    with pytest.raises(OSError, match="copying step 2 from the device failed: an illegal memory access"):
        stager.wait()
    assert_newest(segment, 1)


def test_forget_waits_for_the_write_in_flight_so_no_old_step_reappears(segment: staging.Segment) -> None:
    engine = HeldCopies()
    engine.hold = True
    stager = device_stage.DeviceStager(engine)
    stage(stager, segment, 1)
    threading.Timer(0.2, engine.recorded[-1].release.set).start()
    segment.forget()  # training is over: nothing staged may be persisted after this
    assert newest(Path(segment.path)) is None


def test_an_image_with_device_tensors_is_never_written_by_the_host_path() -> None:
    enc = on_device(shardfile.encode(state(1)))
    with pytest.raises(ValueError, match="device stager"):
        shardfile.write_into(memoryview(bytearray(enc.size)), enc)


def test_a_step_in_flight_at_exit_is_published_before_the_process_is_gone(tmp_path: Path) -> None:
    """A rank that stops (SIGTERM's agreed step, then exit) while its last copy is still going."""
    script = f"""
import sys, threading
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
from launchers.elastic.format import shardfile
from launchers.elastic.ipc import device_stage, staging
import atexit, test_device_stage as t
engine = t.HeldCopies(); engine.hold = True
device_stage._stager = device_stage.DeviceStager(engine)
atexit.register(device_stage._finish)
seg = staging.Segment({str(tmp_path / "mlaunch.run.rank0")!r}, 0, 1, 0)
device_stage._stager.stage(seg, 5, t.on_device(shardfile.encode(t.state(5))))
threading.Timer(0.3, engine.recorded[-1].release.set).start()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = newest(tmp_path / "mlaunch.run.rank0")
    assert got is not None and got[0] == 5 and equal(got[1], state(5))
