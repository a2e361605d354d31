"""One rank's checkpoint shard as a flat byte image: the same bytes in shared memory and on disk.

Why a format of our own instead of ``torch.save``: the agent-side flash save must persist a
rank's staged state *without* the training process and without torch (mlaunch never imports
it). So a shard is laid out so that "persist" is a plain byte copy of the staged image, and
"stage" is a plain ``memcpy`` of tensor memory into shared memory — no pickling of tensor
data, no second copy.

Layout (little endian)::

    MAGIC (8) | header length H (u64) | data length D (u64) | header (H bytes, pickle) |
    zero padding to 64 | data (D bytes; each tensor/array at a 64-byte aligned offset)

The header holds the state's *skeleton* — the user's nested dicts/lists/tuples with every
tensor or numpy array replaced by a ``TensorRef`` — plus a table of blobs (kind, dtype,
shape, offset, size) and the caller's metadata (step, rank...). Anything that is not a
container, tensor or array (ints, strings, RNG tuples, scheduler state) is pickled as is.

Torch and numpy are used only if the caller's process already imported them (a state
holding tensors came from a process that did); this module imports neither.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import struct
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# How the bytes reach the disk lives in ``durable``; the names imported "as" themselves stay
# reachable here, where the writers of shard files (mlaunch's flash save, tests) find them.
from launchers.elastic.durable import SLOW_WRITE_ENV as SLOW_WRITE_ENV
from launchers.elastic.durable import DeadlineExceeded as DeadlineExceeded
from launchers.elastic.durable import copy_range_to_file as copy_range_to_file
from launchers.elastic.durable import create_synced, write_all
from launchers.elastic.durable import fsync_dir as fsync_dir

MAGIC = b"MLCKPT01"
PREFIX = struct.Struct("<8sQQ")
ALIGN = 64


class ShardFormatError(ValueError):
    """The bytes are not a shard image (wrong magic, truncated, or unknown version)."""


@dataclass(frozen=True)
class TensorRef:
    """Placeholder for blob ``index`` inside a pickled skeleton."""

    index: int


@dataclass
class Blob:
    kind: str  # "torch" | "numpy"
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the start of the data section
    nbytes: int


@dataclass
class Encoded:
    """A state ready to be written: the header bytes and the memory of every blob (no copy yet)."""

    prefix_and_header: bytes
    blobs: list[Blob]
    views: list[memoryview]
    data_size: int
    keepalive: list[Any] = field(default_factory=list)  # contiguous copies the views point into

    @property
    def data_start(self) -> int:
        return _align(len(self.prefix_and_header))

    @property
    def size(self) -> int:
        return self.data_start + self.data_size


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# ----------------------------------------------------------------------------------------
# Encoding
# ----------------------------------------------------------------------------------------


def _torch_view(tensor: Any, keep: list[Any]) -> tuple[str, tuple[int, ...], memoryview] | None:
    """Raw bytes of a dense tensor (copied to CPU/contiguous only when needed); None: pickle it."""
    torch = sys.modules["torch"]
    t = tensor.detach()
    if t.layout != torch.strided or t.is_quantized or getattr(t, "is_nested", False):
        return None
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    keep.append(t)
    nbytes = t.numel() * t.element_size()
    dtype = str(t.dtype).removeprefix("torch.")
    if nbytes == 0:
        return dtype, tuple(t.shape), memoryview(b"")
    raw = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())
    return dtype, tuple(t.shape), memoryview(raw).cast("B")


def _numpy_view(array: Any, keep: list[Any]) -> tuple[str, tuple[int, ...], memoryview] | None:
    np = sys.modules["numpy"]
    if array.dtype.hasobject:
        return None
    a = np.ascontiguousarray(array)
    keep.append(a)
    flat = a.reshape(-1).view(np.uint8)
    return a.dtype.str, tuple(array.shape), memoryview(flat).cast("B")


def _map_leaves(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` with its containers copied and ``leaf`` applied to everything else.

    The containers are dict, OrderedDict, list and tuple exactly (a subclass is a leaf); the
    same walk takes a state apart (``encode``) and puts it back together (``decode``).
    """
    kind = type(obj)
    if kind is dict or kind is OrderedDict:
        return kind((k, _map_leaves(v, leaf)) for k, v in obj.items())
    if kind is list:
        return [_map_leaves(v, leaf) for v in obj]
    if kind is tuple:
        return tuple(_map_leaves(v, leaf) for v in obj)
    return leaf(obj)


def encode(state: Any, meta: dict[str, Any] | None = None) -> Encoded:
    """Split ``state`` into a header (skeleton + blob table + meta) and the blobs' memory."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    blobs: list[Blob] = []
    views: list[memoryview] = []
    keep: list[Any] = []
    offset = 0

    def add(kind: str, got: tuple[str, tuple[int, ...], memoryview]) -> TensorRef:
        nonlocal offset
        dtype, shape, view = got
        blobs.append(Blob(kind, dtype, shape, offset, view.nbytes))
        views.append(view)
        offset = _align(offset + view.nbytes)
        return TensorRef(len(blobs) - 1)

    def leaf(obj: Any) -> Any:
        if torch is not None and isinstance(obj, torch.Tensor):
            got = _torch_view(obj, keep)
            return add("torch", got) if got is not None else obj
        if np is not None and isinstance(obj, np.ndarray):
            got = _numpy_view(obj, keep)
            return add("numpy", got) if got is not None else obj
        return obj

    skeleton = _map_leaves(state, leaf)
    header = pickle.dumps(
        {"format": 1, "meta": dict(meta or {}), "skeleton": skeleton, "blobs": blobs},
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    prefix = PREFIX.pack(MAGIC, len(header), offset)
    return Encoded(prefix + header, blobs, views, offset, keep)


# ----------------------------------------------------------------------------------------
# Writing: to a file descriptor, or into a writable buffer (shared memory)
# ----------------------------------------------------------------------------------------


def _pieces(enc: Encoded) -> Iterator[tuple[int, memoryview]]:
    """(absolute offset, bytes) of everything in the image, in order."""
    yield 0, memoryview(enc.prefix_and_header)
    for blob, view in zip(enc.blobs, enc.views, strict=True):
        if view.nbytes:
            yield enc.data_start + blob.offset, view


def write_fd(fd: int, enc: Encoded, deadline: float | None = None) -> int:
    """Write the image at the fd's current position (assumed 0); returns the size written."""
    pos = 0
    for offset, view in _pieces(enc):
        if offset > pos:
            write_all(fd, memoryview(bytes(offset - pos)), deadline, pos)
        write_all(fd, view, deadline, offset)
        pos = offset + view.nbytes
    if pos < enc.size:
        write_all(fd, memoryview(bytes(enc.size - pos)), deadline, pos)
    return enc.size


def write_into(buffer: memoryview, enc: Encoded) -> int:
    """Copy the image into ``buffer`` (e.g. a shared-memory slot); padding is left as is."""
    if buffer.nbytes < enc.size:
        raise ValueError(f"buffer of {buffer.nbytes} bytes is too small for a {enc.size}-byte shard")
    for offset, view in _pieces(enc):
        buffer[offset : offset + view.nbytes] = view
    return enc.size


def write_file(path: str | os.PathLike[str], enc: Encoded, deadline: float | None = None) -> int:
    """Create ``path`` with the image and fsync it; a failed write removes the partial file."""
    return create_synced(path, lambda fd: write_fd(fd, enc, deadline))


# ----------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------


def read_prefix(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(header length, data length) of an image; ShardFormatError if it is not one."""
    if len(data) < PREFIX.size:
        raise ShardFormatError("too short to be a shard")
    magic, hlen, dlen = PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise ShardFormatError(f"bad magic {magic!r}")
    return hlen, dlen


def image_size(data: bytes | bytearray | memoryview) -> int:
    hlen, dlen = read_prefix(data)
    return _align(PREFIX.size + hlen) + dlen


def read_header(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    hlen, _ = read_prefix(data)
    if len(data) < PREFIX.size + hlen:
        raise ShardFormatError("truncated header")
    header: dict[str, Any] = pickle.loads(bytes(data[PREFIX.size : PREFIX.size + hlen]))
    if header.get("format") != 1:
        raise ShardFormatError(f"unknown shard format {header.get('format')!r}")
    return header


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Only the metadata of a shard file (cheap: reads the header, not the data)."""
    with open(path, "rb") as fh:
        head = fh.read(PREFIX.size)
        hlen, _ = read_prefix(head)
        meta: dict[str, Any] = read_header(head + fh.read(hlen))["meta"]
        return meta


def decode(data: bytearray | memoryview) -> tuple[Any, dict[str, Any]]:
    """Rebuild (state, meta) from an image; tensors/arrays get their own memory (copies)."""
    header = read_header(data)
    hlen, dlen = read_prefix(data)
    start = _align(PREFIX.size + hlen)
    if len(data) < start + dlen:
        raise ShardFormatError(f"truncated data: {len(data)} bytes, expected {start + dlen}")
    blobs: list[Blob] = header["blobs"]
    values: list[Any] = []
    data = memoryview(data)  # slices below must not copy
    for blob in blobs:
        begin = start + blob.offset
        raw = data[begin : begin + blob.nbytes]
        values.append(_materialize(blob, raw))
    state = _map_leaves(header["skeleton"], lambda obj: values[obj.index] if type(obj) is TensorRef else obj)
    return state, header["meta"]


def _materialize(blob: Blob, raw: Any) -> Any:
    if blob.kind == "torch":
        import torch

        dtype = getattr(torch, blob.dtype)
        if blob.nbytes == 0:
            return torch.empty(blob.shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return flat.view(dtype).reshape(blob.shape)
    if blob.kind == "numpy":
        import numpy as np

        return np.frombuffer(bytearray(raw), dtype=np.dtype(blob.dtype)).reshape(blob.shape)
    raise ShardFormatError(f"unknown blob kind {blob.kind!r}")


def read_file(path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
    """(state, meta) of a shard file (mapped, so each tensor is copied once, from the page cache)."""
    import mmap

    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < PREFIX.size:
            raise ShardFormatError(f"{path}: truncated ({size} bytes)")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)
    try:
        expected = image_size(view)
        if size < expected:
            raise ShardFormatError(f"{path}: truncated ({size} bytes, expected {expected})")
        return decode(view)
    finally:
        view.release()
        mm.close()
