"""What a committed checkpoint holds, in DCP's terms: the ``Metadata`` its load planner plans against.

Why: resharding (load what N ranks saved into M ranks, another mesh, another placement) is
what DCP's planner does; it only needs to be told, per key, the global shape and the chunks
that exist (``TensorStorageMetadata``), or that a key is a plain value
(``BytesStorageMetadata``). mlaunch's shard files carry exactly that in their JSON headers:
every DTensor piece has its global shape, offsets and sizes (``tensors.dtensor_shard``).
So the catalog reads the header of every rank's shard — JSON only, no pickle, no tensor
data — and states it as DCP ``Metadata``; ``reader.MlaunchStorageReader`` then serves
the reads the planner asks for, from the files' bytes.

Keys are DCP's: the state's nested keys joined by dots, walked with DCP's own traversal
(``traverse_state_dict``), so they match what DCP's planner makes of the target state.

Which copy of a key that is *not* a DTensor a rank gets: its own (the value it saved) when
the world size is unchanged and its shard has the key, else the lowest rank's that has it —
the same value on every rank, as DCP does for replicated values (model buffers, optimizer
steps, the RNG of a new world). A DTensor is assembled from the pieces of every rank.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import traverse_state_dict
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

from launchers.elastic.format import layout, plain, shardfile


class Unreadable(OSError):
    """A shard that cannot be read as the checkpoint says (missing, truncated, malformed): try an older step."""


@dataclass(frozen=True)
class Ref:
    """A blob of one rank's shard, named in its skeleton (a tensor, an array, or a trusted pickle)."""

    rank: int
    path: Path
    blob: shardfile.Blob | None  # None: a DTensor piece another replica stores
    data_start: int  # where the file's data section starts
    dtensor: dict[str, Any] | None = None

    @property
    def file_offset(self) -> int:
        assert self.blob is not None
        return self.data_start + self.blob.offset


@dataclass
class Catalog:
    """One committed step as DCP sees it, and where each piece of it lies."""

    step: int
    world_size: int
    metadata: Metadata
    pieces: dict[tuple[str, tuple[int, ...]], Ref] = field(default_factory=dict)  # (key, offsets) → bytes
    values: dict[str, Any] = field(default_factory=dict)  # key → value (Refs inside: read on demand)


@dataclass(frozen=True)
class _Header:
    rank: int
    path: Path
    header: dict[str, Any]
    data_start: int
    blobs: list[shardfile.Blob]


def _read_header(rank: int, path: Path) -> _Header:
    try:
        with open(path, "rb") as fh:
            head = fh.read(shardfile.PREFIX.size)
            hlen, dlen = shardfile.read_prefix(head)
            raw = head + fh.read(hlen)
            size = os.fstat(fh.fileno()).st_size
        header = shardfile.read_header(raw, trusted=False)
        start = shardfile.align(shardfile.PREFIX.size + hlen)
        if size < start + dlen:
            raise shardfile.ShardFormatError(f"truncated: {size} bytes, expected {start + dlen}")
        return _Header(rank, path, header, start, [shardfile.blob_entry(row, dlen) for row in header["blobs"]])
    except shardfile.UntrustedShard as exc:
        raise Unreadable(f"{path}: {exc}") from None  # a legacy (pickled) header: this loader reads format 2 only
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Unreadable(f"{path}: {exc}") from None


def _headers(item: layout.Committed) -> list[_Header]:
    """Every rank's header, read in parallel (each rank's file is on the same storage)."""
    paths = [(rank, item.shard(rank)) for rank in range(item.world_size)]
    with ThreadPoolExecutor(max_workers=min(16, len(paths)), thread_name_prefix="mlaunch-ckpt-headers") as pool:
        return list(pool.map(lambda rp: _read_header(*rp), paths))


def _flat(shard: _Header) -> Iterator[tuple[str, Any]]:
    """(DCP key, value) of one shard's skeleton; tensors and arrays are ``Ref``s."""

    def ref(tag: dict[str, Any]) -> Ref:
        index = tag["$ref"]
        if index is None and "dtensor" in tag:
            return Ref(shard.rank, shard.path, None, shard.data_start, tag["dtensor"])
        if type(index) is not int or not 0 <= index < len(shard.blobs):
            raise shardfile.ShardFormatError(f"{shard.path}: bad blob reference {index!r}")
        return Ref(shard.rank, shard.path, shard.blobs[index], shard.data_start, tag.get("dtensor"))

    try:
        structure = plain.from_json(shard.header["skeleton"], ref)
    except (KeyError, TypeError, ValueError) as exc:
        raise Unreadable(f"{shard.path}: malformed header: {exc}") from None
    found: list[tuple[str, Any]] = []
    if not isinstance(structure, dict):
        raise Unreadable(f"{shard.path}: the saved state is a {type(structure).__name__}, not a dict of keys")
    traverse_state_dict(
        structure,
        lambda path, value: found.append((".".join(map(str, path)), value)),
        keep_traversing=lambda value: isinstance(value, Ref),  # as DCP does for tensors
    )
    return iter(found)


def _torch_dtype(name: str, where: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise Unreadable(f"{where}: not a torch dtype: {name!r}")
    return dtype


class _Builder:
    """Collects every rank's keys into DCP metadata, choosing one copy of each non-DTensor key."""

    def __init__(self, rank: int, world: int, saved_world: int) -> None:
        self.rank, self.same_world = rank, world == saved_world
        self.sharded: dict[str, list[Ref]] = {}
        self.per_rank: dict[str, dict[int, Any]] = {}

    def add(self, shard: _Header) -> None:
        for key, value in _flat(shard):
            if isinstance(value, Ref) and value.dtensor is not None:
                self.sharded.setdefault(key, []).append(value)
            else:
                self.per_rank.setdefault(key, {})[shard.rank] = value

    def build(self, step: int, saved_world: int) -> Catalog:
        catalog = Catalog(step, saved_world, Metadata(state_dict_metadata={}))
        md = catalog.metadata.state_dict_metadata
        mixed = sorted(set(self.sharded) & set(self.per_rank))
        if mixed:
            raise Unreadable(f"key {mixed[0]!r} is a DTensor on some ranks and not on others")
        for key, refs in self.sharded.items():
            md[key] = self._dtensor(key, refs, catalog)
        for key, copies in self.per_rank.items():
            source = self.rank if self.same_world and self.rank in copies else min(copies)
            value = copies[source]
            if isinstance(value, Ref) and value.blob is not None and value.blob.kind != "pickle":
                shape = value.blob.shape
                dtype = _dtype_of(value)
                md[key] = TensorStorageMetadata(
                    TensorProperties(dtype=dtype), torch.Size(shape), [_chunk([0] * len(shape), shape)]
                )
                catalog.pieces[(key, (0,) * len(shape))] = value
            else:
                md[key] = BytesStorageMetadata()
                catalog.values[key] = value
        return catalog

    @staticmethod
    def _dtensor(key: str, refs: list[Ref], catalog: Catalog) -> TensorStorageMetadata:
        first = refs[0].dtensor
        assert first is not None
        shape = [int(n) for n in first["shape"]]
        dtype = _torch_dtype(str(first["dtype"]), key)
        chunks = []
        for ref in refs:
            meta = ref.dtensor
            assert meta is not None
            if [int(n) for n in meta["shape"]] != shape or str(meta["dtype"]) != str(first["dtype"]):
                raise Unreadable(f"key {key!r}: ranks disagree on its global shape or dtype")
            if ref.blob is None:
                continue  # a replica: the rank at coordinate 0 stored this piece
            offsets = tuple(int(n) for n in meta["offsets"])
            if (key, offsets) in catalog.pieces:
                continue  # the same piece from another replica
            catalog.pieces[(key, offsets)] = ref
            chunks.append(_chunk(list(offsets), [int(n) for n in meta["sizes"]]))
        return TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(shape), chunks)


def _chunk(offsets: list[int], sizes: list[int] | tuple[int, ...]) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


def _dtype_of(ref: Ref) -> torch.dtype:
    assert ref.blob is not None
    if ref.blob.kind == "numpy":
        import numpy as np

        return torch.from_numpy(np.empty(0, dtype=np.dtype(ref.blob.dtype))).dtype
    return _torch_dtype(ref.blob.dtype, str(ref.path))


def build(item: layout.Committed, rank: int, world: int) -> Catalog:
    """The catalog of committed ``item`` for ``rank`` of a job of ``world`` ranks (reads every header)."""
    builder = _Builder(rank, world, item.world_size)
    for shard in _headers(item):
        builder.add(shard)
    return builder.build(item.step, item.world_size)


def piece_tensor(ref: Ref, mapped: Any) -> torch.Tensor:
    """A tensor over ``ref``'s bytes in ``mapped`` (a buffer of the whole file): no copy."""
    import warnings

    assert ref.blob is not None
    shape = ref.blob.shape
    dtype = _dtype_of(ref)
    if ref.blob.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():  # a read-only mapping: the tensor is only read from
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=ref.blob.nbytes, offset=ref.file_offset)
    return flat.view(dtype).reshape(shape)


def materialize(value: Any, trusted: bool) -> Any:
    """A plain value with the tensors and arrays it holds read from their files (for DCP's byte items)."""
    if isinstance(value, Ref):
        if value.blob is None or value.dtensor is not None:
            raise Unreadable(f"{value.path}: a DTensor piece inside a tuple cannot be loaded as a value")
        with open(value.path, "rb") as fh:
            fh.seek(value.file_offset)
            raw = fh.read(value.blob.nbytes)
        if len(raw) != value.blob.nbytes:
            raise Unreadable(f"{value.path}: truncated blob")
        if value.blob.kind == "pickle" and not trusted:
            raise shardfile.UntrustedShard(
                "the checkpoint holds a pickled object: unpickling runs code, so it is loaded only with "
                "Checkpointer(..., trusted=True) (for checkpoints you wrote yourself)"
            )
        return shardfile.materialize_blob(value.blob, raw)
    if type(value) is list:
        return [materialize(v, trusted) for v in value]
    if type(value) is tuple:
        return tuple(materialize(v, trusted) for v in value)
    if isinstance(value, dict):
        return type(value)((k, materialize(v, trusted)) for k, v in value.items())
    return value


def close_quietly(mapped: Any) -> None:
    with contextlib.suppress(BufferError, ValueError):
        mapped.close()
