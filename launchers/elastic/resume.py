"""Resuming from the newest committed step: every rank the same step, read its own way.

Two ways to read a step (``Checkpointer.load_latest``):

- ``load_latest()`` returns this rank's state as it saved it (its own shard, or a replica's);
  the job must have the world size that saved it, and the shard must hold no DTensor;
- ``load_latest(into=state)`` fills ``state``'s tensors and DTensors in place and replaces its
  plain values, at any world size or mesh: DCP's load planner decides which pieces this rank
  needs and ``dcp.reader`` copies them (``dcp.catalog`` says which copy of a non-DTensor
  value a rank gets). Returns the step.

At another world size ``load_latest()`` works when the state is replicated (DDP: every rank
saved the same values; ``replicated`` compares the shards): rank ``r`` reads saved rank
``r % saved_world``'s shard, and rank 0 says so. State whose values differ between ranks raises
``CheckpointError`` on every rank naming the keys that differ.

The step is agreed first (the newest every rank sees), then read; if a rank cannot read it
(a missing or damaged shard) every rank falls back to an older step together, and says why.
Without ``into`` each rank reads its newest step before the agreement, and one collective says
whether every rank read the same one (the common case: the restart pays one round, not three). A
problem an older step would not fix — pickled objects without ``trusted=True``, a ``state``
that does not match the checkpoint, DTensor shards read without ``into``, per-rank state at
another world size — raises ``CheckpointError`` on every rank instead: starting over would hide
it. Nor does a job start over in silence: when committed steps exist and none can be loaded
(or a rank sees none where another sees some), every rank raises with the reason for each step
tried — unless the job chose ``checkpoint.on_unreadable: start_over`` (``MLAUNCH_ON_UNREADABLE``),
then it starts from scratch with a warning, and mlaunch's status and events show it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launchers.elastic import ddp_layouts, replicated
from launchers.elastic.errors import CheckpointError
from launchers.elastic.format import layout, shardfile
from launchers.elastic.ipc import kept_segments, progress, rank_segment
from launchers.elastic.ranks import collective, env

ON_UNREADABLE_ENV = "MLAUNCH_ON_UNREADABLE"  # "fail" (the default) | "start_over": job.yaml's checkpoint.on_unreadable


class Checkpointer(Protocol):
    """What resuming needs of a ``Checkpointer`` (which calls in here)."""

    loaded: layout.Committed | None

    @property
    def dir(self) -> Path: ...
    @property
    def trusted(self) -> bool: ...
    @property
    def replicas(self) -> Sequence[int]: ...
    @property
    def on_unreadable(self) -> str: ...

    def committed(self) -> list[layout.Committed]: ...


@dataclass(frozen=True)
class Read:
    """What reading one committed step gave this rank."""

    value: Any = None
    error: str | None = None
    fatal: bool = False  # an older step would not help: raise on every rank
    meta: dict[str, Any] | None = None  # the shard's metadata when it was read from memory (not from its file)


def load_latest(ckpt: Checkpointer, into: Any = None) -> Any:
    """The state (``into`` None) or the step loaded into ``into``; None when nothing was ever committed."""
    coll = collective.current()
    rank, world = coll.rank(), coll.world_size()
    ahead = committing(ckpt)
    if rank == 0:
        layout.clean_partial(ckpt.dir, spare={ahead.tmp} if ahead is not None else set())
    candidates = ckpt.committed()
    if ahead is not None and into is not None:  # read through DCP from the files: they must be there
        ahead.wait()
        candidates, ahead = ckpt.committed(), None
    if ahead is not None and (not candidates or ahead.item.step > candidates[0].step):
        candidates = [ahead.item, *candidates]
    newest = candidates[0].step if candidates else -1
    if world > 1:  # the same list on every rank: agree on the newest step everyone sees
        if into is None:
            agreed = _read_newest_and_agree(ckpt, coll, candidates, rank, world)
            if isinstance(agreed, Read):
                return agreed.value
            lowest, highest = agreed
        else:
            lowest, highest = _min_max(coll, newest)
        if lowest < 0 <= highest:
            why = _unseen(ckpt, highest, newest)
            return _start_over(ckpt, rank, world, highest, [why])
        candidates = [c for c in candidates if c.step <= lowest]
    tried: list[str] = []
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
            _resume_ddp_layouts(coll, item, rank, world, got.meta)
            rank_segment.update_status(rank, world, committed_step=item.step)
            return got.value
        why = got.error or "another rank cannot read its part (see its message)"
        tried.append(f"step {item.step}: {why}")
        if got.error is not None:
            collective.say(f"cannot use step {item.step}: {got.error}; trying an older checkpoint")
    ckpt.loaded = None
    if candidates:
        return _start_over(ckpt, rank, world, candidates[0].step, tried)
    return None


def _read_newest_and_agree(
    ckpt: Checkpointer, coll: collective.Collective, candidates: list[layout.Committed], rank: int, world: int
) -> Read | tuple[int, int]:
    """This rank's newest step read first, then one collective: the Read when every rank read the same step.

    Otherwise the least and the greatest newest step over the ranks, as ``_min_max`` gives them, for the
    ordinary way (agree, read, agree that every rank could). The common case — every rank sees the same
    newest step and reads it — then costs one collective instead of three (the step, the read, DDP's
    layouts): each is a round over every rank, milliseconds on a busy host and more between hosts, on the
    way of every restart. Only at the world size that saved the step (reading another one's is collective)
    and without ``into`` (a read into the caller's state cannot be taken back when the ranks disagree).
    """
    item = candidates[0] if candidates and candidates[0].world_size == world else None
    got = own_shard(ckpt, item, rank, world) if item is not None else Read(error="not read")
    layouts = _layouts_of(item, rank, got.meta) if item is not None and got.error is None else None
    step = candidates[0].step if candidates else -1
    (low, high), (least_ok, _), (same_low, same_high) = _ranges(
        coll, [step, int(layouts is not None), layouts.digest() if layouts is not None else 0]
    )
    if item is None or layouts is None or not (low == high and least_ok == 1):
        return low, high
    ckpt.loaded = item
    ddp_layouts.resumed(layouts, same_low == same_high)
    rank_segment.update_status(rank, world, committed_step=item.step)
    return got


def _ranges(coll: collective.Collective, values: list[int]) -> list[tuple[int, int]]:
    """The least and the greatest of each of ``values`` over the ranks, in one collective (the min of v and -v)."""
    reduced = coll.all_reduce([x for value in values for x in (value, -value)], "min")
    return [(reduced[i], -reduced[i + 1]) for i in range(0, len(reduced), 2)]


def _min_max(coll: collective.Collective, value: int) -> tuple[int, int]:
    """The least and the greatest ``value`` over the ranks, in one collective."""
    return _ranges(coll, [value])[0]


def _resume_ddp_layouts(
    coll: collective.Collective, item: layout.Committed, rank: int, world: int, meta: dict[str, Any] | None
) -> None:
    """DDP's bucket layouts, set before the first step (issue 48), the same on every rank.

    Read from the lowest saved rank's shard (a grown job's new ranks have none of their own), or, for a step
    still being committed (no file yet), from this rank's image ``meta``; set only when every rank read the
    same: DDP's own rebuild broadcasts rank 0's layout for the same reason.
    """
    layouts = _layouts_of(item, rank, meta)
    agreed = True
    if world > 1:
        low, high = _min_max(coll, layouts.digest())
        agreed = low == high
    ddp_layouts.resumed(layouts, agreed)


def _layouts_of(item: layout.Committed, rank: int, meta: dict[str, Any] | None) -> ddp_layouts.Recorded:
    """DDP's bucket layouts recorded with ``item``: the lowest saved rank's file's, else this rank's ``meta``."""
    saved = sorted(int(r) for r in item.manifest.get("shards", {}))
    lowest = item.shard(saved[0]) if saved else None
    if lowest is not None and lowest.is_file():
        return ddp_layouts.recorded(lowest)
    return ddp_layouts.recorded(item.shard(rank), meta)


def _unseen(ckpt: Checkpointer, highest: int, mine: int) -> str:
    where = f"this rank sees step {mine}" if mine >= 0 else f"this rank sees no committed step in {ckpt.dir}"
    return (
        f"another rank sees committed step {highest} but not every rank sees one ({where}): is the checkpoint "
        "directory on storage every node shares?"
    )


def _start_over(ckpt: Checkpointer, rank: int, world: int, newest: int, tried: list[str]) -> None:
    """Committed steps exist and none can be loaded: raise on every rank, or start over if the job says so."""
    reasons = "; ".join(tried)
    if ckpt.on_unreadable != "start_over":
        raise CheckpointError(
            f"committed checkpoints exist in {ckpt.dir} (newest: step {newest}) but none can be loaded — {reasons}. "
            "Nothing was loaded and training did not start over: fix the cause, or set checkpoint.on_unreadable: "
            "start_over in job.yaml to train from scratch anyway"
        )
    collective.say(
        f"WARNING: starting over from scratch although step {newest} is committed (checkpoint.on_unreadable: "
        f"start_over) — {reasons}"
    )
    progress.started_over(newest)
    rank_segment.update_status(rank, world, committed_step=-1)
    return None


def own_shard(ckpt: Checkpointer, item: layout.Committed, rank: int, world: int) -> Read:
    """This rank's state from its own shard of ``item`` (or a replica's); at another world size, a replicated one's."""
    sources = [rank, *[r for r in ckpt.replicas if r != rank]]
    if item.world_size != world:
        checked = _replicated_source(item, rank, world)
        if isinstance(checked, Read):
            return checked
        sources = [checked]
    for source in sources:
        path = item.shard(source)
        if str(source) not in item.manifest["shards"]:
            continue
        try:
            staged = _kept_state(ckpt, item, source) if source == rank and item.world_size == world else None
            if staged is not None:
                collective.say(f"step {item.step} read from the memory the in-place recovery kept, not from {path}")
                return Read(staged[0], meta=staged[1])
            if COMMITTING in item.manifest:  # the kept image cannot be used: the file, once committed
                _await_commit(item)
            if not path.exists():
                continue
            state, _meta = shardfile.read_file(path, trusted=ckpt.trusted)
        except shardfile.UntrustedShard as exc:
            return Read(error=f"needs trusted=True: {path}: {exc}", fatal=True)
        except shardfile.ShardedState as exc:
            return Read(error=f"{path}: {exc}", fatal=True)
        except (OSError, ValueError) as exc:
            return Read(error=f"{path}: {exc}")
        return Read(state)
    return Read(error=f"no shard for rank {rank} in {item.path}")


def _kept_state(ckpt: Checkpointer, item: layout.Committed, rank: int) -> tuple[Any, dict[str, Any]] | None:
    """This rank's shard of ``item`` decoded from the memory an in-place recovery kept (``ipc.kept_segments``).

    The flash save committed ``item`` from these very bytes: the image is used when it has the
    committed shard's step and size and its header (the metadata and the table of every tensor) is
    the committed file's, byte for byte (a read of a few KiB); None otherwise: the file is read.
    A step mlaunch is still committing beside the recovery (``_Committing``) has no file yet: it is
    being written from this very image, which is used when its step and size are the step's.
    """
    entry = item.manifest["shards"].get(str(rank))
    run_id = env.run_id()
    if not run_id or not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int):
        return None

    committing = COMMITTING in item.manifest

    def decode(image: memoryview) -> tuple[Any, dict[str, Any]] | None:
        if not committing and not _same_header(image, item.shard(rank)):
            return None
        try:
            return shardfile.decode(image, trusted=ckpt.trusted)
        except (shardfile.UntrustedShard, shardfile.ShardedState):
            raise  # the file holds the same: said as for the file
        except (OSError, ValueError):
            return None  # not what was committed after all: the file is read

    return kept_segments.read_kept(run_id, rank, item.step, entry["bytes"], decode)


@dataclass(frozen=True)
class _Committing:
    """The step mlaunch decided after a peer's failure and commits beside the in-place recovery (``kept_segments``).

    Every rank of the re-formed group resumes from it although its marker may not be on disk yet: its
    image is in the memory kept for the rank, and it is newer than every committed step. ``item`` is
    the commit to be (the manifest of this node's shards and the id its marker will carry, so that the
    ranks' next saves continue its lineage; ``COMMITTING`` in it says it is not on disk yet); ``tmp``
    the directory it is written in, which rank 0's clean-up must leave alone.
    """

    item: layout.Committed
    tmp: Path

    def wait(self) -> None:
        _await_commit(self.item)


COMMITTING = "committing beside"  # a manifest key only an item of ``_Committing`` has: its commit's deadline


def committing(ckpt: Checkpointer) -> _Committing | None:
    """The step mlaunch commits (or committed) beside an in-place recovery into ``ckpt``'s directory; None if it failed.

    ``load_latest`` takes it ahead of the committed steps only while it is newer than all of them.
    """
    record = kept_segments.pending(env.run_id())
    if record is None or record.get("state") == kept_segments.FAILED:
        return None
    try:
        if Path(record["dir"]).resolve() != ckpt.dir.resolve():
            return None
        step = int(record["step"])
        manifest = {**dict(record["manifest"]), COMMITTING: float(record.get("deadline", 0.0))}
        item = layout.Committed(step, ckpt.dir / layout.step_name(step), manifest)
        return _Committing(item, ckpt.dir / str(record["tmp"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _await_commit(item: layout.Committed) -> None:
    """Until mlaunch's commit of ``item`` beside the recovery ended (committed or not), or its deadline passed."""
    import time

    left = float(item.manifest[COMMITTING]) - time.monotonic()
    kept_segments.await_commit(env.run_id(), item.step, max(left, 0.0))


def _same_header(image: memoryview, path: Path) -> bool:
    """The shard image's prefix and header equal the first bytes of the file at ``path``."""
    try:
        size = shardfile.PREFIX.size + shardfile.read_prefix(image)[0]
        with open(path, "rb") as fh:
            return fh.read(size) == bytes(image[:size])
    except (OSError, ValueError):
        return False


def _replicated_source(item: layout.Committed, rank: int, world: int) -> int | Read:
    """The saved rank whose shard this rank reads at another world size (collective), or why it cannot."""
    saved = item.world_size
    shards = [item.shard(r) for r in range(saved)]
    try:
        differ = replicated.compare(shards, rank, world, collective.current())
    except replicated.NotComparable as exc:
        return Read(error=f"{item.path}: {exc}", fatal=exc.sharded)
    if differ:
        return Read(
            error=(
                f"it was written by {saved} ranks and this job has {world}, and its state is not replicated: "
                f"the values of {replicated.describe(differ)} differ between the ranks that saved it, so no "
                "saved rank's state is this rank's. Load it with load_latest(into=state), which reshards tensors "
                "and DTensors to this world size, or keep per-rank values out of the checkpoint"
            ),
            fatal=True,
        )
    source = rank % saved
    if rank == 0:
        collective.say(
            f"step {item.step} was written by {saved} ranks, this job has {world}: its state is replicated (every "
            f"saved rank holds the same values), so rank r reads saved rank r % {saved}'s shard"
        )
    return source


def load_into(ckpt: Checkpointer, item: layout.Committed, into: Any) -> Read:
    """Fill ``into`` from ``item`` through DCP's load planner and mlaunch's reader (collective with a group)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from launchers.elastic.dcp import catalog
    from launchers.elastic.dcp.reader import MlaunchStorageReader

    if not isinstance(into, dict):
        return Read(error=f"into= must be a dict of the state to fill (got a {type(into).__name__})", fatal=True)
    reader = MlaunchStorageReader(committed=item, trusted=ckpt.trusted)
    grouped = dist.is_available() and dist.is_initialized()
    try:
        dcp.load(into, storage_reader=reader, no_dist=not grouped)
    except CheckpointException as exc:
        causes = [failure[0] for failure in exc.failures.values()]
        retry = all(isinstance(cause, catalog.Unreadable) for cause in causes)
        return Read(error="; ".join(sorted({_describe(c) for c in causes})), fatal=not retry)
    except catalog.Unreadable as exc:  # not wrapped where no process group is up
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
