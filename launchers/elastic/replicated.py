"""Is a checkpoint's state replicated? Known at load time, from the shards themselves.

A plain ``load_latest()`` returns this rank's state as it was saved. At the world size that
saved it every rank reads its own shard. At another world size (an elastic job shrank or
grew) there is no "own" shard — but in data-parallel training (DDP) every rank saved the
same values, so any shard is every rank's state: rank ``r`` reads shard ``r % saved_world``.
State that is *not* replicated (per-rank RNG streams, a per-rank data position, a rank's own
slice of something) cannot be handed to another world size that way; ``load_latest(into=)``
reshards what can be resharded.

How "replicated" is known: when the world size differs, the ranks compare the shards before
any of them uses one. Every leaf of the state (a tensor, an array, a scalar) gets a 40-bit
digest of its bytes (SHA-1 with its dtype and shape; about 1.8 GB/s); the new ranks split the
old shards between them, and two all-reduces (MIN and MAX of every leaf's digest) tell every
rank which leaves differ between any two shards. Nothing is recorded at save time: the save
and ``stage()`` pay nothing, checkpoints written before this check are covered, and the cost —
reading and hashing each old shard once, spread over the new ranks — is paid only at a world
size change, where the shard is being read anyway. 40 bits, because MindSpore's collectives
carry integers through float32 halves of 20 bits each (``collective.MindSpore``).

``compare`` returns the leaves whose values differ (empty: replicated); a caller names them
in its ``CheckpointError``.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.elastic.format import shardfile
from launchers.elastic.format.shard_encode import PREFIX, align
from launchers.elastic.ranks import collective

DIGEST_BITS = 40
_NONE_MIN = 1 << DIGEST_BITS  # a rank that read no shard: neutral for MIN
_NONE_MAX = -1  # … and for MAX


@dataclass(frozen=True)
class Leaves:
    """One shard's leaves in order: their paths and 40-bit digests, and a digest of the structure."""

    paths: list[str]
    digests: list[int]
    structure: int


def _digest(*parts: bytes | memoryview) -> int:
    hasher = hashlib.sha1(usedforsecurity=False)
    for part in parts:
        hasher.update(part)
    return int.from_bytes(hasher.digest()[:5], "little")


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) of a shard header's skeleton: ``$ref`` blobs and plain values, in order."""
    if type(node) is list:
        for index, value in enumerate(node):
            yield from walk(value, f"{path}[{index}]")
        return
    if type(node) is not dict:
        yield path, node
        return
    tags = [k for k in node if k.startswith("$")]
    if not tags:
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}" if path else key)
        return
    tag, body = tags[0], node[tags[0]]
    if tag == "$tuple" and type(body) is list:
        for index, value in enumerate(body):
            yield from walk(value, f"{path}[{index}]")
    elif tag in ("$dict", "$odict") and type(body) is list:
        for pair in body:
            key, value = pair
            yield from walk(value, f"{path}[{json.dumps(key, sort_keys=True)}]")
    else:
        yield path, node


def leaves(path: Path) -> Leaves:
    """The leaves of one shard file (its whole data is read once, through a mapping)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < PREFIX.size:
            raise shardfile.ShardFormatError(f"{path}: truncated ({size} bytes)")
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mm)
    try:
        return _leaves_of(view)
    finally:
        view.release()
        mm.close()


def _leaves_of(view: memoryview) -> Leaves:
    if bytes(view[:8]) == shardfile.LEGACY_MAGIC:  # a pickled header: never unpickled to compare
        raise shardfile.ShardFormatError("an older mlaunch's shard (pickled header): load it at its own world size")
    header = shardfile.read_header(view)
    hlen, dlen = shardfile.read_prefix(view)
    start = align(PREFIX.size + hlen)
    blobs = [shardfile.blob_entry(row, dlen) for row in header["blobs"]]
    paths: list[str] = []
    digests: list[int] = []
    shape: list[Any] = []
    for where, leaf in walk(header["skeleton"]):
        paths.append(where)
        if type(leaf) is dict and "$ref" in leaf:
            if "dtensor" in leaf:
                raise shardfile.ShardedState(shardfile.SHARDED_ADVICE)
            blob = blobs[int(leaf["$ref"])]
            kind = f"{blob.kind}:{blob.dtype}:{list(blob.shape)}".encode()
            digests.append(_digest(kind, view[start + blob.offset : start + blob.offset + blob.nbytes]))
            shape.append([where, "ref"])
        else:
            digests.append(_digest(json.dumps(leaf, sort_keys=True).encode()))
            shape.append([where, "value"])
    return Leaves(paths, digests, _digest(json.dumps(shape).encode()))


def assigned(rank: int, world: int, saved: int, grouped: bool) -> list[int]:
    """The old shards ``rank`` reads for the comparison (each read once by the job; all of them without a group)."""
    if not grouped:
        return list(range(saved))
    return list(range(rank, saved, world))


class NotComparable(ValueError):
    """A shard could not be read for the comparison (raised on every rank alike; ``sharded``: DTensor state)."""

    def __init__(self, why: str, sharded: bool = False) -> None:
        super().__init__(why)
        self.sharded = sharded


def compare(shards: list[Path], rank: int, world: int, coll: collective.Collective) -> list[str]:
    """The leaf paths whose values differ between the ``shards`` of one step (collective): [] when replicated.

    ``shards[i]`` is old rank i's file. A shard that cannot be read raises ``NotComparable`` on
    every rank (the ranks agree on that first, so none is left waiting in a reduction).
    """
    grouped = coll.name != "local" and world > 1
    error, sharded = "", False
    try:
        mine = [leaves(shards[i]) for i in assigned(rank, world, len(shards), grouped)]
        probe = mine[0] if mine else leaves(shards[rank % len(shards)])  # the layout, to size the reduction
    except shardfile.ShardedState as exc:
        error, sharded = str(exc), True
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    verdict = 2 if sharded else 1 if error else 0
    if grouped:
        verdict = coll.all_reduce([verdict], "max")[0]
    if verdict:
        raise NotComparable(error or "another rank cannot read its shard (see its message)", sharded=verdict == 2)
    count = len(probe.digests)
    shape = [
        min((x.structure for x in mine), default=_NONE_MIN),
        max((x.structure for x in mine), default=_NONE_MAX),
        min((len(x.digests) for x in mine), default=_NONE_MIN),
        max((len(x.digests) for x in mine), default=_NONE_MAX),
        count,
        count,
    ]
    if grouped:
        low = coll.all_reduce([shape[0], shape[2], shape[4]], "min")
        high = coll.all_reduce([shape[1], shape[3], shape[5]], "max")
        shape = [low[0], high[0], low[1], high[1], low[2], high[2]]
    if shape[0] != shape[1] or shape[4] != shape[5]:
        return ["(the shards hold different keys)"]
    lows = [min((x.digests[i] for x in mine), default=_NONE_MIN) for i in range(count)]
    highs = [max((x.digests[i] for x in mine), default=_NONE_MAX) for i in range(count)]
    if grouped:
        lows = coll.all_reduce(lows, "min")
        highs = coll.all_reduce(highs, "max")
    return [probe.paths[i] for i in range(count) if lows[i] != highs[i]]


def describe(paths: list[str], limit: int = 6) -> str:
    """The differing leaves, grouped by top-level key: ``'rng' (rng.python, rng.torch), 'data' (data.position)``."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        top = path.split(".", 1)[0].split("[", 1)[0] or path
        groups.setdefault(top, []).append(path)
    parts = []
    for top, members in groups.items():
        shown = ", ".join(members[:limit]) + (f", … {len(members) - limit} more" if len(members) > limit else "")
        parts.append(f"{top!r} ({shown})")
    return "; ".join(parts)
