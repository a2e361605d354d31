"""Agent-side flash save: mlaunch persists what the ranks staged when they cannot save themselves.

A rank killed with ``kill -9``, one that crashed, or one stuck in a collective cannot run
its SIGTERM handler. If the script calls ``Checkpointer.stage(step, state)`` each step, its
newest states are in shared memory (``launchers.elastic.ipc.staging``); this module writes them
to the checkpoint directory in the same format ``Checkpointer.load_latest`` reads, and
commits them the same way (shards, fsync, marker last).

What is persisted: the newest step that *every* rank staged completely in this attempt.
Each rank has two slots, so the previous step survives a kill in the middle of a copy; a
slot counts only if its sequence number is even before and after the copy (a torn slot is
never written). Steps of an earlier attempt never mix with this one's. Nothing is written
when that step is already committed (the ranks saved it themselves).

Several nodes (each node's mlaunch persists its own ranks) agree through the job's control
plane (``JobEvents.reduce``, ``launchers.control``), the one way a step is agreed between nodes:

1. every node sends the steps all its ranks staged completely; node 0's hub intersects them and
   every node persists the newest common step (a lost node ends the wait at once);
2. each node writes its ranks' shards into ``step_N.flash-<key>.tmp/`` and sends their sizes to
   node 0 alone;
3. node 0 commits: marker last, then the rename.

A multi-node share without the plane is refused ("failed"): every real multi-node run has one
(``launchers.control.open_job_events``), and an agreement through files on the checkpoint
directory, which only tests reached, is gone.

The key is the restart attempt and that attempt's rendezvous port, the same on every node.
All waits end at a deadline; what is not committed by then is removed by node 0 and ignored
by readers. In local simulation one mlaunch acts for every node and the waits return at once.
The checkpoint directory must be shared storage when there are several real nodes (as for
any multi-node checkpoint that one rank commits).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from launchers.control import Exchange, Reduction, topics
from launchers.elastic.format import layout, shardfile
from launchers.elastic.ipc import staging
from launchers.persist import agent_commit


class TornSlot(RuntimeError):
    """A slot changed while it was being copied (its writer is alive and went on)."""


@dataclass
class FlashResult:
    # unstaged: no rank staged anything in this attempt (a script that never calls stage): nothing to say;
    # pending: decided, and committed beside an in-place recovery (``persist.commit_beside``)
    status: Literal["committed", "written", "nothing", "unstaged", "skipped", "failed", "pending"]
    message: str
    step: int | None = None
    path: Path | None = None
    seconds: float = 0.0
    nbytes: int = 0
    ranks: list[int] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.status == "committed"


@dataclass
class _Share:
    """This mlaunch's share of the flash save: its ranks and their nodes, in the job's ``nnodes``."""

    rank_nodes: Mapping[int, int]
    nnodes: int
    key: str
    attempt: int
    deadline: float
    exchange: Exchange | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rank_nodes)

    @property
    def nodes(self) -> list[int]:
        return sorted(set(self.rank_nodes.values()))

    @property
    def others_write(self) -> bool:
        """Other nodes' mlaunch write their own ranks (real nodes, not a local simulation)."""
        return self.nnodes > len(self.nodes)


@dataclass
class _Staged:
    """The slots this node's ranks staged in the attempt (rank → step → slot), all for one checkpoint."""

    slots: dict[int, dict[int, staging.Slot]]
    root: Path
    world: int
    keep: int
    lineage: dict[str, Any] = field(default_factory=dict)  # the line of training the ranks continue (``layout``)


def persist(
    run_id: str,
    *,
    attempt: int,
    rank_nodes: Mapping[int, int],
    nnodes: int,
    key: str,
    deadline: float,
    exchange: Exchange | None = None,
) -> FlashResult:
    """Persist and (on node 0) commit the newest step every rank of ``rank_nodes`` staged.

    ``rank_nodes`` maps each rank this mlaunch runs to its node index; ``deadline`` is a
    ``time.monotonic()`` value after which nothing more is written (and nothing committed).
    """
    decided = decide(
        run_id, attempt=attempt, rank_nodes=rank_nodes, nnodes=nnodes, key=key, deadline=deadline, exchange=exchange
    )
    return decided if isinstance(decided, FlashResult) else decided.write()


@dataclass
class Decided:
    """The step to persist, agreed by every node, and the open segments to write it from (``write``).

    Split from the write so that an in-place recovery can wake its ranks as soon as the step is known
    and let the write and the commit run beside them (``persist.commit_beside``): the segments stay
    open here (and are kept, not unlinked, by mlaunch) until ``write`` has read them.
    """

    readers: dict[int, staging.SegmentReader]
    staged: _Staged
    step: int
    share: _Share
    started: float
    id: str = field(default_factory=lambda: uuid.uuid4().hex)  # the commit's id, known before it is written

    @property
    def root(self) -> Path:
        return self.staged.root

    @property
    def tmp(self) -> Path:
        return _tmp_dir(self.staged.root, self.step, self.share.key)

    def sizes(self) -> dict[int, int]:
        """This node's ranks' shard sizes of the step (their slots' lengths)."""
        return {rank: slots[self.step].length for rank, slots in self.staged.slots.items()}

    def manifest(self) -> dict[str, Any]:
        """What the commit's marker will say of this node's ranks (``layout.commit``), before it is written."""
        shards = {str(r): {"file": layout.shard_name(r), "bytes": n} for r, n in sorted(self.sizes().items())}
        return {
            "step": self.step,
            "world_size": self.staged.world,
            "shards": shards,
            "id": self.id,
            **self.staged.lineage,
        }

    def write(self) -> FlashResult:
        """Write this node's shards and (node 0) commit them; the segments are closed after."""
        try:
            return _guarded(lambda: _write(self.readers, self.staged, self.step, self.share, self.started, self.id))
        finally:
            self.close()

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


def decide(
    run_id: str,
    *,
    attempt: int,
    rank_nodes: Mapping[int, int],
    nnodes: int,
    key: str,
    deadline: float,
    exchange: Exchange | None = None,
) -> Decided | FlashResult:
    """The newest step every rank of ``rank_nodes`` (every node) staged, with its segments open; or why none."""
    started = time.monotonic()
    share = _Share(rank_nodes, nnodes, key, attempt, deadline, exchange)
    readers: dict[int, staging.SegmentReader] = {}
    for path in staging.run_segments(run_id):
        with contextlib.suppress(OSError, ValueError):
            reader = staging.SegmentReader(path)
            readers[reader.info.rank] = reader
    handed = False
    try:
        if share.others_write and share.exchange is None:
            return FlashResult("failed", "the other nodes' ranks need the control plane to agree on a step")
        staged = _guarded(lambda: _staged(readers, share))
        if isinstance(staged, FlashResult):
            if share.others_write and share.exchange is not None:  # the other nodes need not wait for us
                with contextlib.suppress(RuntimeError):
                    share.exchange(topics.flash_candidates(share.key), [], 0.0, Reduction.INTERSECT)
            return staged
        step = _guarded(lambda: _decide(staged, share))
        if isinstance(step, FlashResult):
            return step
        handed = True
        return Decided(readers, staged, step, share, started)
    finally:
        if not handed:
            for reader in readers.values():
                reader.close()


T = TypeVar("T")


def _guarded(call: Callable[[], T]) -> T | FlashResult:
    """``call``, or the ``FlashResult`` that says why it failed (nothing committed)."""
    try:
        return call()
    except shardfile.DeadlineExceeded:
        return FlashResult("failed", "the deadline passed before every shard was written; nothing committed")
    except RuntimeError as exc:  # the control plane's ExchangeFailed: a node was lost or late
        return FlashResult("failed", f"{exc}; nothing committed")
    except TornSlot as exc:
        return FlashResult("failed", f"{exc}; nothing committed")
    except OSError as exc:
        return FlashResult("failed", f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}")


def _tmp_dir(root: Path, step: int, key: str) -> Path:
    return root / f"{layout.step_name(step)}.flash-{key}.tmp"


def _staged(readers: dict[int, staging.SegmentReader], share: _Share) -> _Staged | FlashResult:
    """What every rank staged in this attempt, or why there is nothing to persist."""
    if not readers:
        return FlashResult("unstaged", "no rank staged its state")
    ranks = share.ranks
    missing = [r for r in ranks if r not in readers]
    staged: dict[int, dict[int, staging.Slot]] = {}
    for rank in ranks:
        if rank in readers:
            slots = readers[rank].slots()
            staged[rank] = {s.step: s for s in slots if s.complete and s.attempt == share.attempt}
    if missing or any(not steps for steps in staged.values()):
        empty = sorted(set(missing) | {r for r, s in staged.items() if not s})
        status: Literal["nothing", "unstaged"] = "unstaged" if len(empty) == len(ranks) else "nothing"
        return FlashResult(status, f"rank(s) {empty} staged nothing in this attempt")
    infos = [readers[r].info for r in ranks]
    dirs = {i.ckpt_dir for i in infos}
    worlds = {i.world for i in infos}
    if len(dirs) != 1 or len(worlds) != 1:
        return FlashResult("failed", f"ranks disagree on the checkpoint directory or world size: {dirs} {worlds}")
    first = min(staged)
    slot = max(staged[first].values(), key=lambda s: s.step)
    lineage = layout.image_lineage(readers[first].data(slot))
    return _Staged(staged, Path(dirs.pop()), worlds.pop(), max(i.keep for i in infos) or 3, lineage)


def _decide(staged: _Staged, share: _Share) -> int | FlashResult:
    """The step to persist: the newest every rank (every node) staged, if newer than the committed one."""
    common = set.intersection(*(set(s) for s in staged.slots.values()))
    if share.others_write and share.exchange is not None:
        topic = topics.flash_candidates(share.key)
        both = set(share.exchange(topic, sorted(common), share.deadline, Reduction.INTERSECT))
        decision = max(both) if both else None
        if decision is None:
            return FlashResult("nothing", "the nodes have no staged step in common")
    elif not common:
        return FlashResult("nothing", "no step was staged by every rank (they are too far apart)")
    else:
        decision = max(common)
    newest = layout.newest_for(staged.root, staged.lineage.get("lineage"), staged.lineage.get("resumed_step"))
    if newest is not None and decision <= newest:
        return FlashResult("skipped", f"step {decision} is not newer than committed step {newest}", decision)
    return decision


def _write(
    readers: dict[int, staging.SegmentReader], staged: _Staged, step: int, share: _Share, started: float, id: str
) -> FlashResult:
    """Write this node's shards of ``step``; commit it where this is node 0 (the others' sizes come by the plane)."""
    root = staged.root
    tmp = _tmp_dir(root, step, share.key)
    kept = False  # the directory is committed, or node 0's to commit
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        sizes = _copy_slots(readers, staged.slots, step, tmp, share.deadline)
        nbytes = sum(sizes.values())
        all_sizes = sizes
        if share.others_write and share.exchange is not None:
            mine = {str(r): n for r, n in sizes.items()}
            topic = topics.flash_done(share.key)
            gathered = share.exchange(topic, mine, share.deadline, Reduction.GATHER0) or {}  # node 0's alone
            all_sizes = {int(r): int(n) for done in gathered.values() for r, n in done.items()}
            if 0 not in share.nodes:
                kept = True
                return FlashResult("written", f"wrote step {step}; node 0 commits", step, nbytes=nbytes)
        final = agent_commit.commit_step(
            tmp,
            root,
            step,
            staged.world,
            all_sizes,
            keep=staged.keep,
            source="flash",
            attempt=share.attempt,
            id=id,
            **staged.lineage,
        )
        kept = True
    finally:
        if not kept:
            agent_commit.discard(tmp, coordinator=0 in share.nodes, shards=share.rank_nodes)
    took = time.monotonic() - started
    message = f"committed step {step} from shared memory ({_mb(nbytes)} in {took * 1000:.0f} ms)"
    return FlashResult("committed", message, step, final, took, nbytes, share.ranks)


def _copy_slots(
    readers: dict[int, staging.SegmentReader],
    staged: dict[int, dict[int, staging.Slot]],
    step: int,
    tmp: Path,
    deadline: float,
) -> dict[int, int]:
    """Every rank's slot of ``step`` to its shard file, in parallel (each write ends with an fsync)."""
    ranks = sorted(staged)
    if len(ranks) == 1:
        rank = ranks[0]
        return {rank: _copy_slot(readers[rank], staged[rank][step], tmp / layout.shard_name(rank), deadline)}
    # Threads only for the length of this call (joined before it returns): the supervisor
    # never forks while one of them is alive.
    with ThreadPoolExecutor(max_workers=min(8, len(ranks)), thread_name_prefix="flash-save") as pool:
        futures = {
            rank: pool.submit(_copy_slot, readers[rank], staged[rank][step], tmp / layout.shard_name(rank), deadline)
            for rank in ranks
        }
        return {rank: future.result() for rank, future in futures.items()}


def _copy_slot(reader: staging.SegmentReader, slot: staging.Slot, path: Path, deadline: float) -> int:
    """Write one slot's image to ``path`` (fsynced), refusing it if the slot changed meanwhile."""
    seq = slot.seq
    rank = reader.info.rank
    if reader.seq(slot.index) != seq:
        raise TornSlot(f"rank {rank}'s slot for step {slot.step} is being rewritten")
    head = reader.data(slot)
    try:
        if shardfile.image_size(head[: min(slot.length, 1 << 16)]) != slot.length:
            raise TornSlot(f"rank {rank}'s slot for step {slot.step} does not hold a whole shard")
    except ValueError as exc:  # bad magic: not a shard image
        raise TornSlot(f"rank {rank}'s slot for step {slot.step}: {exc}") from None
    finally:
        head.release()

    def unchanged() -> None:
        if reader.seq(slot.index) != seq:
            raise TornSlot(f"rank {rank}'s slot for step {slot.step} changed while it was copied")

    return shardfile.copy_range_to_file(path, reader.fd, reader.offset(slot), slot.length, deadline, unchanged)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"
