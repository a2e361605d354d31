"""One rank's checkpoint shard as a flat byte image: the same bytes in shared memory and on disk.

Why a format of our own instead of ``torch.save``: the agent-side flash save must persist a
rank's staged state *without* the training process and without torch (mlaunch never imports
it). So a shard is laid out so that "persist" is a plain byte copy of the staged image, and
"stage" is a plain ``memcpy`` of tensor memory into shared memory — no pickling of tensor
data, no second copy.

Layout (little endian)::

    MAGIC (8) | header length H (u64) | data length D (u64) | header (H bytes, UTF-8 JSON) |
    zero padding to 64 | data (D bytes; each tensor/array at a 64-byte aligned offset)

The header is data only, as in safetensors: the state's *skeleton* — the user's nested
dicts/lists/tuples as JSON (``plain``), with every tensor or numpy array replaced by
``{"$ref": i}`` — plus a table of blobs (kind, dtype, shape, offset, size) and the caller's
metadata (step, rank...). Reading a shard parses JSON and copies bytes: it runs no code the
file could choose. Other objects are refused unless the writer passed ``trusted=True``; then
each is pickled into a blob of its own, which only a reader that passes ``trusted=True``
unpickles. Shards of mlaunch before this format (magic ``MLCKPT01``) have a pickled header:
they are read only with ``trusted=True``, and otherwise refused with a message saying so.

Torch and numpy are used only if the caller's process already imported them (a state
holding tensors came from a process that did); this module imports neither.
"""

from __future__ import annotations

import json
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from launchers.elastic.format import plain
from launchers.elastic.format.shard_encode import ALIGN as ALIGN
from launchers.elastic.format.shard_encode import FORMAT, MAGIC, PREFIX, Blob, Encoded, align
from launchers.elastic.format.shard_encode import encode as encode

# How the bytes reach the disk lives in ``durable``; the names imported "as" themselves stay
# reachable here, where the writers of shard files (mlaunch's flash save, tests) find them.
from launchers.elastic.storage.durable import DeadlineExceeded as DeadlineExceeded
from launchers.elastic.storage.durable import copy_range_to_file as copy_range_to_file
from launchers.elastic.storage.durable import create_synced, write_all, write_image
from launchers.elastic.storage.durable import fsync_dir as fsync_dir

LEGACY_MAGIC = b"MLCKPT01"  # pickled header: read only when trusted


class ShardFormatError(ValueError):
    """The bytes are not a shard image (wrong magic, truncated, or unknown version)."""


class ShardedState(ValueError):
    """The shard holds DTensor shards: only a load that knows the target's layout can place them."""


SHARDED_ADVICE = (
    "it holds DTensor shards (FSDP2 / tensor parallel state), which are placed into the DTensors of the "
    "running job: load it with load_latest(into=state), state being e.g. get_state_dict(model, optimizer)"
)


class UntrustedShard(ShardFormatError):
    """The shard holds pickled objects (or a pickled header): it is read only with ``trusted=True``."""


LEGACY_ADVICE = (
    "it was written by an older mlaunch, whose shard header is a pickle: loading it could run code "
    "that whoever could write the checkpoint directory chose. If you wrote it yourself, load it once "
    "with Checkpointer(..., trusted=True) (the next save writes the new, data-only format); otherwise delete it"
)


@dataclass(frozen=True)
class TensorRef:
    """Placeholder for blob ``index`` inside the pickled skeleton of a legacy (MLCKPT01) shard."""

    index: int


def _map_leaves(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` with its containers copied and ``leaf`` applied to the rest (legacy shards' skeletons)."""
    kind = type(obj)
    if kind is dict or kind is OrderedDict:
        return kind((k, _map_leaves(v, leaf)) for k, v in obj.items())
    if kind is list:
        return [_map_leaves(v, leaf) for v in obj]
    if kind is tuple:
        return tuple(_map_leaves(v, leaf) for v in obj)
    return leaf(obj)


# ----------------------------------------------------------------------------------------
# Writing: to a file descriptor, or into a writable buffer (shared memory)
# ----------------------------------------------------------------------------------------


def _pieces(enc: Encoded) -> Iterator[tuple[int, memoryview]]:
    """(absolute offset, bytes) of everything in the image, in order."""
    if enc.on_device:  # its views of those blobs are empty: writing it here would write zeros
        raise ValueError("an image with tensors still on an accelerator is written by the device stager only")
    yield 0, memoryview(enc.prefix_and_header)
    for blob, view in zip(enc.blobs, enc.views, strict=True):
        if view.nbytes:
            yield enc.data_start + blob.offset, view


def write_fd(fd: int, enc: Encoded, deadline: float | None = None) -> int:
    """Write the image at the fd's current position (assumed 0); returns the size written.

    A large image goes past the page cache where the file system allows (``direct_io``).
    """
    if write_image(fd, _pieces(enc), enc.size, deadline):
        return enc.size
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
    if magic not in (MAGIC, LEGACY_MAGIC):
        raise ShardFormatError(f"bad magic {magic!r}")
    return hlen, dlen


def image_size(data: bytes | bytearray | memoryview) -> int:
    hlen, dlen = read_prefix(data)
    return align(PREFIX.size + hlen) + dlen


def read_header(data: bytes | bytearray | memoryview, *, trusted: bool = False) -> dict[str, Any]:
    """The parsed header; a legacy (pickled) one only when ``trusted``, else ``UntrustedShard``."""
    hlen, _ = read_prefix(data)
    if len(data) < PREFIX.size + hlen:
        raise ShardFormatError("truncated header")
    raw = bytes(data[PREFIX.size : PREFIX.size + hlen])
    if bytes(data[:8]) == LEGACY_MAGIC:
        if not trusted:
            raise UntrustedShard(LEGACY_ADVICE)
        legacy: dict[str, Any] = pickle.loads(raw)  # trusted by the caller
        if legacy.get("format") != 1:
            raise ShardFormatError(f"unknown shard format {legacy.get('format')!r}")
        return legacy
    try:
        header = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError included
        raise ShardFormatError(f"header is not JSON: {exc}") from None
    if type(header) is not dict or header.get("format") != FORMAT:
        raise ShardFormatError(f"unknown shard format {header.get('format') if type(header) is dict else header!r}")
    return header


def read_meta(path: str | os.PathLike[str], *, trusted: bool = False) -> dict[str, Any]:
    """Only the metadata of a shard file (cheap: reads the header, not the data)."""
    with open(path, "rb") as fh:
        head = fh.read(PREFIX.size)
        hlen, _ = read_prefix(head)
        meta: dict[str, Any] = read_header(head + fh.read(hlen), trusted=trusted)["meta"]
        return meta


def decode(data: bytearray | memoryview, *, trusted: bool = False) -> tuple[Any, dict[str, Any]]:
    """Rebuild (state, meta) from an image; tensors/arrays get their own memory (copies).

    Pickled objects (saved with ``trusted=True``) are unpickled only when ``trusted``.
    """
    header = read_header(data, trusted=trusted)
    hlen, dlen = read_prefix(data)
    start = align(PREFIX.size + hlen)
    if len(data) < start + dlen:
        raise ShardFormatError(f"truncated data: {len(data)} bytes, expected {start + dlen}")
    data = memoryview(data)  # slices below must not copy
    if header["format"] == 1:  # legacy, trusted
        values = [materialize_blob(b, data[start + b.offset : start + b.offset + b.nbytes]) for b in header["blobs"]]
        state = _map_leaves(header["skeleton"], lambda obj: values[obj.index] if type(obj) is TensorRef else obj)
        return state, header["meta"]
    blobs = [blob_entry(row, dlen) for row in header["blobs"]]

    def ref(tag: dict[str, Any]) -> Any:
        if "dtensor" in tag:
            raise ShardedState(SHARDED_ADVICE)
        index = tag["$ref"]
        if type(index) is not int or not 0 <= index < len(blobs):
            raise ShardFormatError(f"bad blob reference {index!r}")
        blob = blobs[index]
        if blob.kind == "pickle" and not trusted:
            raise UntrustedShard(
                f"the checkpoint holds a pickled {tag.get('type', 'object')}: unpickling runs code, so it is "
                "loaded only with Checkpointer(..., trusted=True) (for checkpoints you wrote yourself)"
            )
        return materialize_blob(blob, data[start + blob.offset : start + blob.offset + blob.nbytes])

    try:
        return plain.from_json(header["skeleton"], ref), dict(header["meta"])
    except (KeyError, TypeError, IndexError) as exc:
        raise ShardFormatError(f"malformed header: {exc!r}") from None


def blob_entry(row: Any, dlen: int) -> Blob:
    """One row of a header's blob table, checked to lie inside the data section."""
    try:
        kind, dtype, shape, offset, nbytes = row
        blob = Blob(str(kind), str(dtype), tuple(int(n) for n in shape), int(offset), int(nbytes))
    except (TypeError, ValueError) as exc:
        raise ShardFormatError(f"malformed blob entry {row!r}: {exc}") from None
    if blob.offset < 0 or blob.nbytes < 0 or blob.offset + blob.nbytes > dlen or min(blob.shape, default=0) < 0:
        raise ShardFormatError(f"blob {row!r} lies outside the data section ({dlen} bytes)")
    return blob


def materialize_blob(blob: Blob, raw: Any) -> Any:
    count = 1
    for n in blob.shape:
        count *= n
    if blob.kind == "torch":
        import torch

        dtype = getattr(torch, blob.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ShardFormatError(f"not a torch dtype: {blob.dtype!r}")
        if count * dtype.itemsize != blob.nbytes:
            raise ShardFormatError(f"blob of {blob.nbytes} bytes does not hold {blob.shape} {blob.dtype}")
        if blob.nbytes == 0:
            return torch.empty(blob.shape, dtype=dtype)
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        return flat.view(dtype).reshape(blob.shape)
    if blob.kind == "numpy":
        import numpy as np

        np_dtype = np.dtype(blob.dtype)
        if np_dtype.hasobject or count * np_dtype.itemsize != blob.nbytes:
            raise ShardFormatError(f"blob of {blob.nbytes} bytes does not hold {blob.shape} {blob.dtype}")
        return np.frombuffer(bytearray(raw), dtype=np_dtype).reshape(blob.shape)
    if blob.kind == "pickle":
        return pickle.loads(bytes(raw))  # only reached when the reader trusts the checkpoint
    raise ShardFormatError(f"unknown blob kind {blob.kind!r}")


def read_file(path: str | os.PathLike[str], *, trusted: bool = False) -> tuple[Any, dict[str, Any]]:
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
        return decode(view, trusted=trusted)
    finally:
        try:
            view.release()
            mm.close()
        except BufferError:  # an error's traceback still holds slices: the GC closes the map
            pass
