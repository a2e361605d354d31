"""A state split into what a shard image holds: a JSON header and the raw memory of every blob.

The header is the state's *skeleton* (``plain``: the user's containers as JSON, each tensor
or array replaced by ``{"$ref": i}``), a table of blobs (kind, dtype, shape, offset, size)
and the caller's metadata. A DTensor's ``$ref`` carries ``"dtensor"``: its global shape,
where this rank's shard lies in it, placements and mesh (``tensors.dtensor_shard``) — what a
reader at another world size needs to find the pieces it wants. Nothing is copied here: the
blobs are views of the tensors' memory, copied once by whoever writes the image.
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

from launchers.elastic.format import plain, tensors

MAGIC = b"MLCKPT02"
FORMAT = 2
PREFIX = struct.Struct("<8sQQ")  # magic, header length, data length
ALIGN = 64


@dataclass
class Blob:
    kind: str  # "torch" | "numpy" | "pickle" (a trusted object)
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
    # blob index → its tensor still on an accelerator (``encode(on_device=True)``; its view is empty):
    # only the device stager (``ipc.device_stage``) writes such an image, after copying these to host memory
    on_device: dict[int, Any] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return align(len(self.prefix_and_header))

    @property
    def size(self) -> int:
        return self.data_start + self.data_size


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _numpy_bytes(array: Any) -> tensors.TensorBytes | None:
    np = sys.modules["numpy"]
    if array.dtype.hasobject:
        return None
    a = np.ascontiguousarray(array)
    flat = a.reshape(-1).view(np.uint8)
    return tensors.TensorBytes(a.dtype.str, tuple(array.shape), memoryview(flat).cast("B"), a)


class _Encoder:
    """Collects the blobs of one state while ``plain.to_json`` walks it (``leaf`` is called per non-plain value)."""

    def __init__(self, trusted: bool, on_device: bool = False) -> None:
        self.trusted = trusted
        self.keep_on_device = on_device
        self.on_device: dict[int, Any] = {}
        self.torch = sys.modules.get("torch")
        self.np = sys.modules.get("numpy")
        self.dtensor = tensors.dtensor_class() if self.torch is not None else None
        self.blobs: list[Blob] = []
        self.views: list[memoryview] = []
        self.keep: list[Any] = []
        self.offset = 0

    def add(self, kind: str, got: tensors.TensorBytes) -> dict[str, Any]:
        if got.device is not None:
            self.on_device[len(self.blobs)] = got.device
        self.blobs.append(Blob(kind, got.dtype, got.shape, self.offset, got.nbytes))
        self.views.append(got.view)
        self.keep.append(got.keep)
        self.offset = align(self.offset + got.nbytes)
        return {"$ref": len(self.blobs) - 1}

    def leaf(self, obj: Any, where: str) -> Any:
        if isinstance(obj, tensors.DShard):  # a piece DCP's planner handed over (``dcp.writer``)
            return self.piece(obj, where)
        if self.torch is not None and isinstance(obj, self.torch.Tensor):
            tag = self.tensor(obj, where)
            if tag is not None:
                return tag
        elif self.np is not None and isinstance(obj, self.np.ndarray):
            got = _numpy_bytes(obj)
            if got is not None:
                return self.add("numpy", got)
        if not self.trusted:
            plain.refuse(obj, where)
        pickled = memoryview(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        ref = self.add("pickle", tensors.TensorBytes("", (), pickled, None))
        return {**ref, "type": f"{type(obj).__module__}.{type(obj).__qualname__}"}

    def piece(self, shard: tensors.DShard, where: str) -> dict[str, Any]:
        """A DTensor's piece: its bytes (unless another replica stores them) and where it lies in the whole."""
        if shard.local is None:
            return {"$ref": None, "dtensor": shard.meta}
        local = tensors.plain_bytes(shard.local, f"{where}.to_local()", on_device=self.keep_on_device)
        if local is None:
            raise tensors.UnsupportedTensor(f"{where}: the DTensor's local shard is not a dense strided tensor")
        return {**self.add("torch", local), "dtensor": shard.meta}

    def tensor(self, obj: Any, where: str) -> dict[str, Any] | None:
        """A tensor's tag, or None when a trusted checkpoint should pickle it instead."""
        if self.dtensor is not None and isinstance(obj, self.dtensor):
            return self.piece(tensors.dtensor_shard(obj, where), where)
        try:
            got = tensors.plain_bytes(obj, where, on_device=self.keep_on_device)
        except tensors.UnsupportedTensor:
            if not self.trusted:
                raise
            return None  # a trusted checkpoint pickles what it cannot store as bytes
        return self.add("torch", got) if got is not None else None


def encode(
    state: Any, meta: dict[str, Any] | None = None, *, trusted: bool = False, on_device: bool = False
) -> Encoded:
    """Split ``state`` into a header (skeleton + blob table + meta) and the blobs' memory.

    ``on_device``: accelerator tensors are not copied to host memory here (``Encoded.on_device``).

    Raises ``plain.UnsafeState`` (a TypeError; ``tensors.UnsupportedTensor`` for tensors) for
    a value that is not plain data, unless ``trusted``: then it is pickled into a blob.
    """
    encoder = _Encoder(trusted, on_device)
    skeleton = plain.to_json(state, encoder.leaf)
    table = [[b.kind, b.dtype, list(b.shape), b.offset, b.nbytes] for b in encoder.blobs]
    header = json.dumps(
        {"format": FORMAT, "meta": dict(meta or {}), "skeleton": skeleton, "blobs": table},
        ensure_ascii=False,
        allow_nan=False,
        separators=(",", ":"),
    ).encode()
    prefix = PREFIX.pack(MAGIC, len(header), encoder.offset)
    return Encoded(prefix + header, encoder.blobs, encoder.views, encoder.offset, encoder.keep, encoder.on_device)
