"""Resuming from the newest committed step: every rank the same step, read its own way.

Two ways to read a step (``Checkpointer.load_latest``):

- ``load_latest()`` returns this rank's state as it saved it (its own shard, or a replica's);
  the job must have the world size that saved it, and the shard must hold no DTensor;
- ``load_latest(into=state)`` fills ``state``'s tensors and DTensors in place and replaces its
  plain values, at any world size or mesh: DCP's load planner decides which pieces this rank
  needs and ``dcp_reader`` copies them (``dcp_catalog`` says which copy of a non-DTensor
  value a rank gets). Returns the step.

The step is agreed first (the newest every rank sees), then read; if a rank cannot read it
(a missing or damaged shard) every rank falls back to an older step together. A problem an
older step would not fix — pickled objects without ``trusted=True``, a ``state`` that does
not match the checkpoint, DTensor shards read without ``into`` — raises ``CheckpointError``
on every rank instead: starting over would hide it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launchers.elastic import collective, layout, shardfile, staging
from launchers.elastic.errors import CheckpointError


class Checkpointer(Protocol):
    """What resuming needs of a ``Checkpointer`` (which calls in here)."""

    loaded: layout.Committed | None

    @property
    def dir(self) -> Path: ...
    @property
    def trusted(self) -> bool: ...
    @property
    def replicas(self) -> Sequence[int]: ...

    def committed(self) -> list[layout.Committed]: ...


@dataclass(frozen=True)
class Read:
    """What reading one committed step gave this rank."""

    value: Any = None
    error: str | None = None
    fatal: bool = False  # an older step would not help: raise on every rank


def load_latest(ckpt: Checkpointer, into: Any = None) -> Any:
    """The state (``into`` None) or the step loaded into ``into``; None when nothing committed can be used."""
    coll = collective.current()
    rank, world = coll.rank(), coll.world_size()
    if rank == 0:
        layout.clean_partial(ckpt.dir)
    candidates = ckpt.committed()
    if world > 1:  # the same list on every rank: agree on the newest step everyone sees
        newest = coll.all_reduce([candidates[0].step if candidates else -1], "min")[0]
        candidates = [c for c in candidates if c.step <= newest]
    for item in candidates:
        got = own_shard(ckpt, item, rank, world) if into is None else load_into(ckpt, item, into)
        ok = 1 if got.error is None else -1 if got.fatal else 0
        if world > 1:
            ok = coll.all_reduce([ok], "min")[0]
        if ok < 0:
            why = got.error or "another rank cannot (see its message)"
            raise CheckpointError(f"cannot load step {item.step}: {why}")
        if ok:
            ckpt.loaded = item
            staging.update_status(rank, world, committed_step=item.step)
            return got.value
        if got.error is not None:
            collective.say(f"cannot use step {item.step}: {got.error}; trying an older checkpoint")
    ckpt.loaded = None
    return None


def own_shard(ckpt: Checkpointer, item: layout.Committed, rank: int, world: int) -> Read:
    """This rank's state from its own shard of ``item`` (or a replica's): the world size must match."""
    if item.world_size != world:
        return Read(
            error=f"it was written by {item.world_size} ranks, this job has {world} (load_latest(into=state) reshards)"
        )
    for source in [rank, *[r for r in ckpt.replicas if r != rank]]:
        path = item.shard(source)
        if str(source) not in item.manifest["shards"] or not path.exists():
            continue
        try:
            state, _meta = shardfile.read_file(path, trusted=ckpt.trusted)
        except shardfile.UntrustedShard as exc:
            return Read(error=f"needs trusted=True: {path}: {exc}", fatal=True)
        except shardfile.ShardedState as exc:
            return Read(error=f"{path}: {exc}", fatal=True)
        except (OSError, ValueError) as exc:
            return Read(error=f"{path}: {exc}")
        return Read(state)
    return Read(error=f"no shard for rank {rank} in {item.path}")


def load_into(ckpt: Checkpointer, item: layout.Committed, into: Any) -> Read:
    """Fill ``into`` from ``item`` through DCP's load planner and mlaunch's reader (collective with a group)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from launchers.elastic import dcp_catalog
    from launchers.elastic.dcp_reader import MlaunchStorageReader

    if not isinstance(into, dict):
        return Read(error=f"into= must be a dict of the state to fill (got a {type(into).__name__})", fatal=True)
    reader = MlaunchStorageReader(committed=item, trusted=ckpt.trusted)
    grouped = dist.is_available() and dist.is_initialized()
    try:
        dcp.load(into, storage_reader=reader, no_dist=not grouped)
    except CheckpointException as exc:
        causes = [failure[0] for failure in exc.failures.values()]
        retry = all(isinstance(cause, dcp_catalog.Unreadable) for cause in causes)
        return Read(error="; ".join(sorted({_describe(c) for c in causes})), fatal=not retry)
    except dcp_catalog.Unreadable as exc:  # not wrapped where no process group is up
        return Read(error=str(exc))
    except (shardfile.UntrustedShard, RuntimeError, ValueError, KeyError) as exc:
        return Read(error=_describe(exc), fatal=True)
    return Read(item.step)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, shardfile.UntrustedShard):
        return f"needs trusted=True: {text}"
    if "Missing key in checkpoint" in text or "Size mismatch" in text:
        return f"the state to fill does not match the checkpoint: {text}"
    return text
