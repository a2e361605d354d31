"""After a node loss, the survivors commit the newest step the job's state is still whole for.

Before this, a node that left voided every exchange of the old membership and the survivors
resumed from the last commit: up to ``persist_every`` (or the script's own save interval)
steps lost. Now, right after the members met (under the new membership, so the control
plane's exchanges are valid again) and before the next generation's ranks start:

1. every survivor reports what it holds (``replica_plan.Holding``): its own ranks' staged
   steps (shared memory captured when the attempt ended, plus the copies it streamed), the
   neighbour's slots its store received, its ranks' numbers in the next generation, and
   whether the state is sharded — node 0 gets them all (``gather0``);
2. node 0 decides (``replica_plan.decide``, a pure function) and tells each node which shards
   to write (``scatter0``); with nothing newer than the last commit it says why and all stop;
3. each node writes its shards into ``step_N.replica-a<attempt>.tmp/`` (fsynced), node 0 gets
   the sizes (``gather0``) and commits — marker last, the same protocol as every save —, then
   every node learns the step is committed (``max``) before its ranks start and resume.

The checkpoint directory must be shared storage (as for any multi-node commit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launchers.control import topics
from launchers.elastic.format import layout
from launchers.elastic.ranks.env import DEFAULT_KEEP
from launchers.persist import agent_commit
from launchers.persist.replica_plan import Holding, Verdict, decide, ring, verdict_of, verdict_to_wire
from launchers.persist.slot_copy import write_image

Exchange = Callable[[str, Any, float, Any], Any]
WAIT = 60.0  # the survivors' exchanges (they met just before; this covers node 0's writes)


@dataclass
class Captured:
    """This node's share of the attempt a node loss ended: its ranks' staged images and where they go."""

    attempt: int
    images: dict[int, dict[int, bytearray]]  # old rank → step → image (shared memory + copies sent)
    local: dict[int, int]  # old rank → its local rank on this node
    root: Path
    world: int
    keep: int
    sharded: bool
    newest: int = -1
    held: dict[int, list[int]] = field(default_factory=dict)  # the store's slots of the old attempt

    def holding(self, node: int, renumber: Mapping[int, int]) -> Holding:
        own = {r: sorted(s) for r, s in self.images.items() if s}
        return Holding(node, own, self.held, renumber, self.sharded, self.world if own else 0, self.newest)


@dataclass
class Outcome:
    """What this node learned: node 0's verdict, and whether it is committed."""

    verdict: Verdict
    committed: bool = False
    path: Path | None = None
    seconds: float = 0.0
    nbytes: int = 0


def start_generation(
    node: int,
    addr: str,
    captured: Captured | None,
    renumber: Mapping[int, int],
    attempt: int,
    exchange: Exchange,
    held_image: Callable[[int, int], bytearray | None],
) -> tuple[str, Outcome | None]:
    """Every member, before a generation's ranks start: the ring, and after a loss steps 1-3 of the docstring.

    Returns this node's buddy's data-path address ("" for none) and, when some survivor held
    staged state of a generation a node loss ended, what became of it. Every member takes part
    (a node admitted at the same meeting holds nothing), so no exchange waits for a node that
    does not know about it. ``held_image(rank, step)`` reads the store's copy of the old attempt.
    """
    started = time.monotonic()
    deadline = started + WAIT
    mine = captured.holding(node, renumber).to_wire() if captured is not None else None
    gathered = exchange(topics.replica_save(attempt, "have"), {"addr": addr, "have": mine}, deadline, "gather0")
    lead = gathered is not None  # the lowest member gets the gather (node 0, or the next once it is lost)
    decided = _decide(gathered, captured) if lead else {}
    got = exchange(topics.replica_save(attempt, "plan"), decided, deadline, "scatter0") or {}
    shared, own = got.get("all") or {}, got.get("mine") or {}
    buddy = str(own.get("buddy") or "")
    if not shared:
        return buddy, None
    verdict = verdict_of(shared, own.get("writes"), node)
    if verdict.step is None:
        return buddy, Outcome(verdict, seconds=time.monotonic() - started)
    root = Path(str(shared.get("root") or (captured.root if captured else ".")))
    tmp = root / f"{layout.step_name(verdict.step)}.replica-a{attempt}.tmp"
    try:
        sizes = _write(tmp, verdict, captured, held_image)
    except OSError:  # node 0 cannot commit without this node's shards: every node learns it below
        sizes = {}
    all_sizes = exchange(
        topics.replica_save(attempt, "done"), {str(i): n for i, n in sizes.items()}, deadline, "gather0"
    )
    path = _commit(tmp, verdict, all_sizes or {}, captured, attempt) if lead else None
    step = exchange(
        topics.replica_save(attempt, "committed"), verdict.step if path is not None else -1, deadline, "max"
    )
    done = step is not None and int(step) == verdict.step
    return buddy, Outcome(verdict, done, path, time.monotonic() - started, sum(sizes.values()))


def _decide(gathered: Mapping[str, Any], captured: Captured | None) -> dict[str, Any]:
    """Node 0: the ring, and the survivors' verdict where someone holds state of a lost generation."""
    parts = {int(n): v or {} for n, v in gathered.items()}
    succ = ring(list(parts))
    each: dict[str, dict[str, Any]] = {str(n): {"buddy": parts[succ[n]].get("addr", "")} for n in succ}
    holdings = {n: Holding.of(n, p["have"]) for n, p in parts.items() if p.get("have") is not None}
    if not holdings:
        return {"all": None, "each": each}
    root = captured.root if captured is not None else None
    committed = layout.newest_step(root) if root is not None else None
    verdict = replace(decide(holdings), committed=committed)
    if verdict.step is not None and committed is not None and committed >= verdict.step:
        why = f"step {verdict.step} is not newer than committed step {committed}"
        verdict = replace(verdict, how="nothing", step=None, writes={}, reason=why)
    wire = verdict_to_wire(verdict)
    for n, writes in wire["each"].items():
        each.setdefault(n, {})["writes"] = writes
    return {"all": {**wire["all"], "root": str(root) if root is not None else ""}, "each": each}


def _write(
    tmp: Path, verdict: Verdict, captured: Captured | None, held_image: Callable[[int, int], bytearray | None]
) -> dict[int, int]:
    """This node's shards of the verdict's step (index → bytes), fsynced."""
    assert verdict.step is not None
    sizes: dict[int, int] = {}
    writes = [w for ws in verdict.writes.values() for w in ws]
    if not writes:
        return sizes
    tmp.mkdir(parents=True, exist_ok=True)
    never = threading.Event()
    for w in writes:
        if w.source == "own":
            image = captured.images.get(w.rank, {}).get(verdict.step) if captured is not None else None
        else:
            image = held_image(w.rank, verdict.step)
        if image is None:
            raise OSError(f"rank {w.rank}'s image of step {verdict.step} is gone from this node")
        sizes[w.index] = write_image(str(tmp / layout.shard_name(w.index)), image, never)
    return sizes


def _commit(
    tmp: Path, verdict: Verdict, gathered: Mapping[str, Any], captured: Captured | None, attempt: int
) -> Path | None:
    """Node 0: the marker, once every shard of the verdict was written."""
    assert verdict.step is not None
    sizes = {int(i): int(n) for part in gathered.values() for i, n in (part or {}).items()}
    try:
        return agent_commit.commit_step(
            tmp,
            tmp.parent,
            verdict.step,
            verdict.world,
            sizes,
            keep=captured.keep if captured is not None else DEFAULT_KEEP,
            source="replica",
            how=verdict.how,
            attempt=captured.attempt if captured is not None else attempt - 1,
        )
    except OSError:
        layout.remove_tree(tmp)
        return None
