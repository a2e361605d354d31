"""Agent-side flash save: mlaunch persists what the ranks staged when they cannot save themselves.

A rank killed with ``kill -9``, one that crashed, or one stuck in a collective cannot run
its SIGTERM handler. If the script calls ``Checkpointer.stage(step, state)`` each step, its
newest states are in shared memory (``launchers.elastic.staging``); this module writes them
to the checkpoint directory in the same format ``Checkpointer.load_latest`` reads, and
commits them the same way (shards, fsync, marker last).

What is persisted: the newest step that *every* rank staged completely in this attempt.
Each rank has two slots, so the previous step survives a kill in the middle of a copy; a
slot counts only if its sequence number is even before and after the copy (a torn slot is
never written). Steps of an earlier attempt never mix with this one's. Nothing is written
when that step is already committed (the ranks saved it themselves).

Several nodes (each node's mlaunch persists its own ranks), the protocol chosen:

1. each node writes the steps all its ranks have to ``<ckpt>/.flash/<key>/cand_<node>.json``
   and waits for every node's file; the step is the newest one in all of them (every node
   computes the same answer from the same files — no coordinator to elect);
2. each node writes its ranks' shards into ``step_N.flash-<key>.tmp/`` and then its
   ``node_<n>.done`` (tmp + fsync + rename) listing them;
3. node 0 waits for every node's done file and commits: marker last, then the rename.

The key is the restart attempt and that attempt's rendezvous port, the same on every node.
All waits end at a deadline; what is not committed by then is removed by node 0 and ignored
by readers. In local simulation one mlaunch acts for every node and the waits return at once.
The checkpoint directory must be shared storage when there are several real nodes (as for
any multi-node checkpoint that one rank commits).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launchers.elastic import layout, shardfile, staging

_STALE = 600.0  # candidate files older than this (seconds) belong to an earlier run
AGREE_WAIT = 5.0  # how long a node waits for the others to report (their workers fail at about the same time)


class TornSlot(RuntimeError):
    """A slot changed while it was being copied (its writer is alive and went on)."""


@dataclass
class FlashResult:
    status: Literal["committed", "written", "nothing", "skipped", "failed"]
    message: str
    step: int | None = None
    path: Path | None = None
    seconds: float = 0.0
    nbytes: int = 0
    ranks: list[int] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.status == "committed"


def staged_steps(run_id: str, attempt: int) -> dict[int, set[int]]:
    """rank → steps it staged completely in ``attempt`` (for monitoring and tests)."""
    out: dict[int, set[int]] = {}
    for info in staging.read_run(run_id):
        out[info.rank] = {s.step for s in info.slots if s.complete and s.attempt == attempt}
    return out


def persist(
    run_id: str,
    *,
    attempt: int,
    rank_nodes: Mapping[int, int],
    nnodes: int,
    key: str,
    deadline: float,
) -> FlashResult:
    """Persist and (on node 0) commit the newest step every rank of ``rank_nodes`` staged.

    ``rank_nodes`` maps each rank this mlaunch runs to its node index; ``deadline`` is a
    ``time.monotonic()`` value after which nothing more is written (and nothing committed).
    """
    started = time.monotonic()
    readers: dict[int, staging.SegmentReader] = {}
    for path in staging.run_segments(run_id):
        with contextlib.suppress(OSError, ValueError):
            reader = staging.SegmentReader(path)
            readers[reader.info.rank] = reader
    tmp: Path | None = None
    try:
        ranks = sorted(rank_nodes)
        if not readers:
            return FlashResult("nothing", "no rank staged its state")
        missing = [r for r in ranks if r not in readers]
        staged: dict[int, dict[int, staging.Slot]] = {}
        for rank in ranks:
            if rank in readers:
                slots = readers[rank].slots()
                staged[rank] = {s.step: s for s in slots if s.complete and s.attempt == attempt}
        if missing or any(not steps for steps in staged.values()):
            empty = sorted(set(missing) | {r for r, s in staged.items() if not s})
            return FlashResult("nothing", f"rank(s) {empty} staged nothing in this attempt")
        infos = [readers[r].info for r in ranks]
        dirs = {i.ckpt_dir for i in infos}
        worlds = {i.world for i in infos}
        if len(dirs) != 1 or len(worlds) != 1:
            return FlashResult("failed", f"ranks disagree on the checkpoint directory or world size: {dirs} {worlds}")
        root = Path(dirs.pop())
        world = worlds.pop()
        keep = max(i.keep for i in infos) or 3
        common = set.intersection(*(set(s) for s in staged.values()))
        nodes_here = sorted(set(rank_nodes.values()))
        if nnodes > len(nodes_here):
            decision = _agree(root, key, nodes_here, nnodes, common, min(deadline, time.monotonic() + AGREE_WAIT))
            if decision is None:
                return FlashResult("nothing", "the nodes have no staged step in common")
        elif not common:
            return FlashResult("nothing", "no step was staged by every rank (they are too far apart)")
        else:
            decision = max(common)
        newest = layout.newest_step(root)
        if newest is not None and decision <= newest:
            return FlashResult("skipped", f"step {decision} is not newer than committed step {newest}", decision)

        tmp = root / f"{layout.step_name(decision)}.flash-{key}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        sizes = _copy_slots(readers, staged, decision, tmp, deadline)
        nbytes = sum(sizes.values())
        if nnodes > len(nodes_here):  # other nodes' mlaunch write their own ranks: meet in done files
            for node in nodes_here:
                mine = {str(r): sizes[r] for r in ranks if rank_nodes[r] == node}
                layout.write_json_atomic(tmp / f"node_{node}.done", {"node": node, "sizes": mine, "time": time.time()})
            if 0 not in nodes_here:
                tmp = None  # node 0 commits (or cleans up) this directory
                return FlashResult("written", f"wrote step {decision}; node 0 commits", decision, nbytes=nbytes)
            all_sizes = _wait_done(tmp, nnodes, deadline)
            for node in range(nnodes):
                with contextlib.suppress(OSError):
                    (tmp / f"node_{node}.done").unlink()
        else:
            all_sizes = sizes
        final = layout.commit(
            tmp, root / layout.step_name(decision), decision, world, all_sizes, source="flash", attempt=attempt
        )
        tmp = None
        with contextlib.suppress(OSError):
            layout.rotate(root, keep)
        took = time.monotonic() - started
        return FlashResult(
            "committed",
            f"committed step {decision} from shared memory ({_mb(nbytes)} in {took * 1000:.0f} ms)",
            decision,
            final,
            took,
            nbytes,
            ranks,
        )
    except shardfile.DeadlineExceeded:
        return FlashResult("failed", "the deadline passed before every shard was written; nothing committed")
    except TornSlot as exc:
        return FlashResult("failed", f"{exc}; nothing committed")
    except OSError as exc:
        return FlashResult("failed", f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}")
    finally:
        if tmp is not None:
            if 0 in set(rank_nodes.values()):
                layout.remove_tree(tmp)
            else:  # the directory is node 0's to remove; take back only this node's shards
                for rank in rank_nodes:
                    with contextlib.suppress(OSError):
                        (tmp / layout.shard_name(rank)).unlink()
        for reader in readers.values():
            reader.close()


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


def _agree(root: Path, key: str, nodes_here: list[int], nnodes: int, common: set[int], deadline: float) -> int | None:
    """Exchange candidate steps through the checkpoint directory; the newest step all nodes have."""
    area = root / ".flash" / key
    area.mkdir(parents=True, exist_ok=True)
    for node in nodes_here:
        layout.write_json_atomic(area / f"cand_{node}.json", {"steps": sorted(common), "time": time.time()})
    seen: dict[int, set[int]] = {}
    while True:
        for node in range(nnodes):
            if node in seen:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                data = json.loads((area / f"cand_{node}.json").read_text())
                if time.time() - float(data["time"]) < _STALE:
                    seen[node] = {int(s) for s in data["steps"]}
        if len(seen) == nnodes:
            both = set.intersection(*seen.values())
            return max(both) if both else None
        if time.monotonic() > deadline:
            raise shardfile.DeadlineExceeded("not every node reported its staged steps")
        time.sleep(0.02)


def _wait_done(tmp: Path, nnodes: int, deadline: float) -> dict[int, int]:
    sizes: dict[int, int] = {}
    seen: set[int] = set()
    while True:
        for node in range(nnodes):
            if node in seen:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                data = json.loads((tmp / f"node_{node}.done").read_text())
                sizes.update({int(r): int(s) for r, s in data["sizes"].items()})
                seen.add(node)
        if len(seen) == nnodes:
            return sizes
        if time.monotonic() > deadline:
            raise shardfile.DeadlineExceeded("not every node wrote its shards")
        time.sleep(0.02)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"
