"""Background persistence (``checkpoint.persist_every``): mlaunch writes staged steps, the ranks only stage.

A training script that calls ``Checkpointer.stage(step, state)`` every step leaves its newest
two states in shared memory (``launchers.elastic.ipc.staging``). With ``persist_every: N`` this
node's mlaunch writes every N-th of them to the checkpoint directory in a thread of its own
and commits it with the flash save's protocol (shards fsynced, marker last, ``keep``
rotation), so a periodic checkpoint costs the training loop only the memory copy of
``stage()``.

One round per target step T (a multiple of N), one round at a time:

1. wait until every rank of this node staged T (a short poll of the segments' headers);
2. copy each rank's slot of T out of shared memory into this process (``slot_copy``: a slot
   that changed during the copy is refused, so a torn shard is never written); a rank that
   went past T before it could be copied means T is missed;
3. write the copies into ``step_T.bg-<key>.tmp/``; with other nodes (their mlaunch write their
   own ranks) every node reports through the control plane's ``exchange`` whether it wrote T
   and which step it would take next; node 0 commits only when every node wrote T;
4. the next target is the newest of the proposals (the next multiple of N past the newest
   staged step), so nodes that missed different steps meet again on the same one.

A failure or a stop must not race this: the flash save calls ``stop()`` first, which cancels
the write in progress (between two 16 MiB pieces) and waits for a commit already under way;
none starts after it. The thread never prints (the supervisor may fork while it runs); its
messages are said by ``tick()`` from the supervisor loop.

Cost: the private copies of this node's ranks' states (one step's worth) while one is written.
A step that is shorter than copying a slot out means most targets are missed (said once).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launchers.control import Reduction, topics
from launchers.elastic.format import layout
from launchers.log import say
from launchers.persist import agent_commit
from launchers.persist.slot_copy import Header, LiveSegment, Torn, open_ranks, write_image

if TYPE_CHECKING:
    from launchers.control import Exchange, How
    from launchers.plan import LaunchPlan

POLL = 0.01  # seconds between two looks at the slots while a target is due
IDLE_POLL = 0.25  # before every rank staged once
EXCHANGE_WAIT = 120.0  # a round's meeting of the nodes (they stage in lockstep; this covers the writes)
# A round's meeting, reduced by node 0's hub: did every node write, the shard sizes (node 0 commits), the next target.
ROUND_REDUCTION = {"ok": Reduction.AND, "sizes": Reduction.GATHER0, "next": Reduction.MAX}


@dataclass
class _Captured:
    """One step of every rank of this node, copied out of shared memory."""

    step: int
    images: dict[int, bytearray]
    root: Path
    world: int
    keep: int
    lineage: dict[str, Any]  # the line of training the ranks continue (``layout``)


class BackgroundPersist:
    """The background persist of one attempt; inert when ``every`` is None."""

    def __init__(
        self, run_id: str, attempt: int, plan: LaunchPlan, every: int | None, exchange: Exchange | None = None
    ) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.every = every or 0
        self.rank_nodes = {
            p.rank: node.index for node in plan.nodes for p in node.processes if p.role == "worker" and p.rank >= 0
        }
        self.nodes = sorted(set(self.rank_nodes.values()))
        self.others_write = plan.nnodes > len(self.nodes)
        self.exchange = exchange
        self.key = f"a{attempt}p{plan.master_port}"
        self.committed: list[int] = []  # steps this node committed (node 0) or wrote (others)
        self.failed: list[tuple[int, str]] = []  # (step, why) of each write or commit that failed: the tick counts them
        self._cancel = threading.Event()
        self._commit_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()
        self._root: Path | None = None  # the ranks' checkpoint directory, as last seen
        self._segments: dict[int, LiveSegment] = {}  # the thread's descriptors on its ranks' segments
        self._messages: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.enabled = bool(every) and bool(self.rank_nodes)
        if self.enabled and self.others_write and exchange is None:
            self.enabled = False
            say("checkpoint.persist_every is off: the nodes cannot agree on a step without the control plane")

    # -- the supervisor's side -------------------------------------------------------------
    def tick(self) -> None:
        """Start the thread on the first tick (the ranks are running by then); say what it has to say."""
        if self.enabled and self._thread is None and not self._cancel.is_set():
            self._thread = threading.Thread(target=self._run, name="mlaunch-background-persist", daemon=True)
            self._thread.start()
        self._drain()

    def stop(self, wait: float = 5.0) -> None:
        """Cancel the persist in progress; when this returns no background commit runs or will start."""
        self._cancel.set()
        with self._commit_lock:
            pass  # a commit under way finishes (it is short); every later one sees the cancel
        if self._thread is not None:
            self._thread.join(wait)
        self._drain()

    def take_failed(self) -> list[tuple[int, str]]:
        """The failures since the last call (the supervisor's thread counts them; the writer only appends)."""
        taken, self.failed[:] = list(self.failed), []
        return taken

    def _drain(self) -> None:
        while True:
            try:
                say(self._messages.get_nowait())
            except queue.Empty:
                return

    def _once(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            self._messages.put(message)

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        segments = self._segments
        try:
            target = self._first_target(segments)
            round_ = 0
            while target is not None and not self._cancel.is_set():
                captured, newest = self._capture(target, segments)
                if captured is None and newest is None:
                    return  # cancelled while waiting
                target = self._round(round_, target, captured, newest or target)
                round_ += 1
        except Exception as exc:  # never take mlaunch down: say it, stop persisting in the background
            self._messages.put(f"background persistence stopped: {type(exc).__name__}: {exc}")
        finally:
            for seg in segments.values():
                seg.close()

    def _heads(self, segments: dict[int, LiveSegment]) -> dict[int, Header] | None:
        """Every local rank's header, when every one has staged in this attempt; else None."""
        open_ranks(self.run_id, set(self.rank_nodes), segments)
        heads = {}
        for rank in self.rank_nodes:
            seg = segments.get(rank)
            head = seg.header() if seg is not None else None
            if head is None or not head.complete(self.attempt):
                return None
            heads[rank] = head
        return heads

    def _next_after(self, step: int) -> int:
        return (step // self.every + 1) * self.every

    def _first_target(self, segments: dict[int, LiveSegment]) -> int | None:
        """The first multiple of N past what the ranks staged so far (agreed by every node)."""
        while not self._cancel.wait(IDLE_POLL):
            heads = self._heads(segments)
            if heads is not None:
                newest = max(max(h.complete(self.attempt)) for h in heads.values())
                return int(self._meet("start", self._next_after(newest), Reduction.MAX))
        return None

    def _meet(self, step: str, value: Any, how: How) -> Any:
        """This node's part of reducing every node's ``value`` by ``how`` (``launchers.control.reductions``)."""
        if not self.others_write or self.exchange is None:
            from launchers.control.reductions import local

            return local(how, self.nodes[0], value)
        return self.exchange(topics.background(self.key, step), value, time.monotonic() + EXCHANGE_WAIT, how)

    def _capture(self, target: int, segments: dict[int, LiveSegment]) -> tuple[_Captured | None, int | None]:
        """Wait for ``target`` on every local rank and copy it out: (copies or None if missed, newest staged)."""
        while not self._cancel.wait(POLL):
            heads = self._heads(segments)
            if heads is None:
                continue
            staged = {rank: h.complete(self.attempt) for rank, h in heads.items()}
            newest = max(max(s) for s in staged.values())
            if min(max(s) for s in staged.values()) < target:
                continue  # not every rank got there yet
            dirs = {h.ckpt_dir for h in heads.values()}
            self._root = Path(next(iter(dirs)))  # known before a miss: node 0 removes the others' shards of it
            if any(target not in s for s in staged.values()):
                self._once("missed", f"background persist missed step {target}: the ranks staged past it first")
                return None, newest
            if len(dirs) != 1 or len({h.world for h in heads.values()}) != 1:
                self._once("dirs", f"background persist: the ranks disagree on the checkpoint directory: {dirs}")
                return None, newest
            try:
                images = self._copy(segments, heads, {rank: s[target] for rank, s in staged.items()})
            except Torn as exc:
                self._once("torn", f"background persist skipped step {target}: {exc} (the steps are faster)")
                return None, newest
            head = next(iter(heads.values()))
            keep = max(h.keep for h in heads.values()) or 3
            lineage = layout.image_lineage(images[min(images)])
            return _Captured(target, images, Path(dirs.pop()), head.world, keep, lineage), newest
        return None, None

    @staticmethod
    def _copy(
        segments: dict[int, LiveSegment], heads: dict[int, Header], slots: dict[int, Any]
    ) -> dict[int, bytearray]:
        """Every rank's slot, copied in parallel (``preadv`` releases the GIL) — all of one step or Torn."""
        if len(slots) == 1:
            rank = next(iter(slots))
            return {rank: segments[rank].copy(heads[rank], slots[rank])}
        with ThreadPoolExecutor(max_workers=min(8, len(slots)), thread_name_prefix="bg-copy") as pool:
            futures = {rank: pool.submit(segments[rank].copy, heads[rank], slot) for rank, slot in slots.items()}
            return {rank: future.result() for rank, future in futures.items()}

    def _round(self, round_: int, target: int, captured: _Captured | None, newest: int) -> int:
        """Write this node's share of ``target``, meet the other nodes, commit on node 0; the next target."""
        sizes: dict[int, int] = {}
        tmp: Path | None = None
        if captured is not None:
            tmp, sizes = self._write(captured)
        proposal = max(target + self.every, self._next_after(newest))
        mine = {"ok": tmp is not None, "sizes": {str(r): n for r, n in sizes.items()}, "next": proposal}
        met = self._meet(str(round_), mine, ROUND_REDUCTION)
        everyone = bool(met["ok"])
        all_sizes = {int(r): int(n) for sizes in (met["sizes"] or {}).values() for r, n in sizes.items()}
        if tmp is not None and captured is not None:
            if everyone and 0 in self.nodes:
                self._commit(tmp, captured, all_sizes)
            elif everyone:
                self.committed.append(target)  # written; node 0 commits
            else:
                self._discard(tmp)
        elif not everyone and 0 in self.nodes and self._root is not None:  # other nodes' shards of it
            layout.remove_tree(self._root / f"{layout.step_name(target)}.bg-{self.key}.tmp")
        return int(met["next"])

    def _write(self, captured: _Captured) -> tuple[Path | None, dict[int, int]]:
        """This node's shards of the captured step in its temporary directory; (None, {}) if not written."""
        root, step = captured.root, captured.step
        newest = layout.newest_for(root, captured.lineage.get("lineage"), captured.lineage.get("resumed_step"))
        if newest is not None and newest >= step:
            return None, {}  # the ranks saved it (or a newer one) themselves
        tmp = root / f"{layout.step_name(step)}.bg-{self.key}.tmp"
        sizes: dict[int, int] = {}
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            for rank in sorted(captured.images):
                sizes[rank] = write_image(str(tmp / layout.shard_name(rank)), captured.images.pop(rank), self._cancel)
        except (OSError, InterruptedError) as exc:
            if not isinstance(exc, InterruptedError):
                self.failed.append((step, str(exc)))
                self._once(
                    "write",
                    f"background persist of step {step} failed: {exc}; the next multiple of persist_every is tried "
                    "(every failure is counted: status.json's persist_failures, events.jsonl's persist_failed)",
                )
            self._discard(tmp)
            return None, {}
        return tmp, sizes

    def _commit(self, tmp: Path, captured: _Captured, sizes: dict[int, int]) -> None:
        with self._commit_lock:
            if self._cancel.is_set() or self._forgotten():  # a failure or stop: the flash save's turn
                self._discard(tmp)
                return
            try:
                final = agent_commit.commit_step(
                    tmp,
                    captured.root,
                    captured.step,
                    captured.world,
                    sizes,
                    keep=captured.keep,
                    source="background",
                    attempt=self.attempt,
                    **captured.lineage,
                )
            except OSError as exc:
                self.failed.append((captured.step, str(exc)))
                self._once("commit", f"background persist could not commit step {captured.step}: {exc}")
                self._discard(tmp)
                return
            if self._forgotten():  # the run finished meanwhile (see _forgotten): leave nothing behind
                layout.remove_tree(final)
                return
        self.committed.append(captured.step)
        self._messages.put(f"persisted step {captured.step} in the background ({final})")

    def _forgotten(self) -> bool:
        """A rank dropped what it staged: ``Checkpointer.clear()``, the run is over.

        ``clear()`` forgets the slots, then rank 0 removes every committed step; a background
        commit must not outlive that (the next run would resume from it instead of starting
        fresh). Checked before and again after the commit: a ``clear()`` that forgets later
        also removes later, so the commit cannot survive either way.
        """
        for seg in self._segments.values():
            head = seg.header()
            if head is None or not head.complete(self.attempt):
                return True
        return False

    def _discard(self, tmp: Path) -> None:
        agent_commit.discard(tmp, coordinator=0 in self.nodes, shards=self.rank_nodes)
