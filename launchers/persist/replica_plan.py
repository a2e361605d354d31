"""Decisions of machine-loss replication, as pure functions of what each node holds (no socket, no file).

Why pure: what the survivors of a node loss commit is decided once, by node 0, from every
survivor's report; the same function is what the unit tests drive with made-up holdings.

Two kinds of state survive a machine differently (``checkpoint.replicate``):

- **replicated** (a DDP job: no staged shard holds a DTensor slice): every rank held the same
  model and optimizer, so the survivors already hold every distinct byte. They commit the
  newest step all of *their* ranks staged, as a checkpoint of the next generation's world:
  shard ``i`` is the survivor whose new rank is the ``i``-th (each rank's own per-rank values —
  RNG, data position — stay its own; ``load_latest()`` and ``load_latest(into=)`` both read it);
- **sharded** (FSDP2, TP: DTensor slices): a lost rank's slices exist nowhere else unless a buddy
  holds a copy (``peer_copy``). The step committed is the newest for which *every* old rank's
  shard is held by a live node — its owner (shared memory, or the copies it sent), else the
  node it streamed to. The checkpoint keeps the old world's shards; ``load_latest(into=)``
  reshards it into the smaller job. When a shard is held by nobody (its owner and its buddy
  were both lost) nothing newer than the last commit can be made: the survivors fall back to
  it, and the verdict says which ranks were lost with their buddy.

The ring (who streams to whom) is the members' sorted platform indexes: each node sends to the
next, the last to the first, so every node holds one neighbour's copy; it re-forms with every
generation's membership.

**Rounds.** The survivors can commit a step only if every shard of it is still held — the lost
node's by its buddy, theirs by themselves — so the nodes must copy *the same* steps. Each chose
its own (its newest when its link was free) before, and one slow stream then held steps nobody
else kept: a loss of that node fell back to the last commit. Now the nodes stream in rounds
agreed through the control plane (``round_of``): in each, every node offers its newest staged
step and the steps it sent and still keeps; all send the oldest newest step, and the newest step
that every node kept becomes the round's **anchor**, which every sender and every buddy keeps
(``keep_after``) until a newer one is agreed. A loss then costs at most the steps since the
anchor, however slow one stream is; rounds go at the pace of the slowest stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

How = Literal["replicated", "buddy", "own", "fallback", "nothing"]


def ring(members: Sequence[int]) -> dict[int, int]:
    """node → the node it streams its staged slots to (the next member; none for a single node)."""
    order = sorted(set(members))
    if len(order) < 2:
        return {}
    return {node: order[(i + 1) % len(order)] for i, node in enumerate(order)}


ROUND_HOW = {"newest": "min", "kept": "intersect"}  # how the nodes' offers for a round are reduced


def round_offer(newest_staged: int, kept: Iterable[int]) -> dict[str, Any]:
    """This node's part of a round: its newest staged step, and the steps it sent, had stored, and keeps."""
    return {"newest": newest_staged, "kept": sorted(kept)}


@dataclass(frozen=True)
class Round:
    """What a round's reduction decided for every node alike."""

    step: int  # the step every node copies and sends now: the oldest of the nodes' newest staged steps
    anchor: int | None  # the newest step every node's buddy holds and every node kept (None: none yet)


def round_of(reduced: Mapping[str, Any]) -> Round:
    """Every node's offers reduced (``ROUND_HOW``) → the round: no step is skipped by one node and sent by another."""
    kept = [int(s) for s in reduced.get("kept") or ()]
    return Round(int(reduced["newest"]), max(kept) if kept else None)


def keep_after(held: Iterable[int], anchor: int | None, newest: int | None = None) -> set[int]:
    """Of the steps ``held`` (a sender's sent copies, or a buddy's slots of one sender), the ones to keep.

    The anchor (every node holds it: what a loss falls back to at worst) and the newest (what a
    loss costs when every node got as far); never more than two, so memory stays two slots.
    Before the first anchor is agreed, the two newest.
    """
    held = set(held)
    newest = max(held, default=None) if newest is None else newest
    if anchor is None:
        return set(sorted(s for s in held if newest is None or s <= newest)[-2:])
    return {s for s in held if s in (anchor, newest)}


@dataclass(frozen=True)
class Holding:
    """What one member can provide after a loss (its part of the survivors' first exchange)."""

    node: int
    own: Mapping[int, Sequence[int]] = field(default_factory=dict)  # old rank → steps of its own ranks
    held: Mapping[int, Sequence[int]] = field(default_factory=dict)  # old rank → steps of a neighbour's ranks
    renumber: Mapping[int, int] = field(default_factory=dict)  # its old rank → its rank in the next generation
    sharded: bool = False
    world: int = 0  # the old generation's world size (0: this node staged nothing)
    newest: int = -1  # the newest step its ranks staged

    def to_wire(self) -> dict[str, Any]:
        return {
            "own": {str(r): sorted(s) for r, s in self.own.items()},
            "held": {str(r): sorted(s) for r, s in self.held.items()},
            "renumber": {str(r): n for r, n in self.renumber.items()},
            "sharded": self.sharded,
            "world": self.world,
            "newest": self.newest,
        }

    @classmethod
    def of(cls, node: int, data: Mapping[str, Any]) -> Holding:
        def steps(raw: Any) -> dict[int, list[int]]:
            return {int(r): [int(s) for s in v] for r, v in (raw or {}).items()}

        return cls(
            node=node,
            own=steps(data.get("own")),
            held=steps(data.get("held")),
            renumber={int(r): int(n) for r, n in (data.get("renumber") or {}).items()},
            sharded=bool(data.get("sharded")),
            world=int(data.get("world") or 0),
            newest=int(data.get("newest", -1)),
        )


@dataclass(frozen=True)
class Write:
    """One shard a node writes: old rank ``rank``'s image of the step, as shard ``index``, from ``source``."""

    rank: int
    index: int
    source: Literal["own", "held"]


@dataclass(frozen=True)
class Verdict:
    """Node 0's decision: the step to commit (None: nothing newer than the last commit) and who writes what."""

    how: How
    step: int | None
    world: int = 0  # the committed checkpoint's world size (its number of shards)
    newest: int = -1  # the newest step any survivor staged
    writes: Mapping[int, Sequence[Write]] = field(default_factory=dict)  # node → its shards
    reason: str = ""
    lost: tuple[int, ...] = ()  # the old ranks no survivor runs (empty: no node was lost)
    committed: int | None = None  # the newest step committed before (what a fallback resumes from)

    @property
    def lost_steps(self) -> int | None:
        """Steps the loss cost beyond the newest staged one (None when it fell back to the last commit)."""
        return None if self.step is None else max(0, self.newest - self.step)


def decide(holdings: Mapping[int, Holding]) -> Verdict:
    """The survivors' commit after a node loss, from every live member's ``Holding``."""
    staged = {n: h for n, h in holdings.items() if h.world > 0 and h.own}
    if not staged:
        return Verdict("nothing", None, reason="no survivor had staged a step in the attempt that ended")
    newest = max(h.newest for h in staged.values())
    world = max(h.world for h in staged.values())
    lost = tuple(sorted(set(range(world)) - {r for h in staged.values() for r in h.own}))
    if not any(h.sharded for h in staged.values()):
        verdict = _replicated(staged, newest)
    else:
        verdict = _sharded(holdings, staged, newest)
    return replace(verdict, lost=lost)


def _replicated(staged: Mapping[int, Holding], newest: int) -> Verdict:
    """Every rank held the same model and optimizer: the survivors' own ranks make the checkpoint."""
    ranks = {r: (n, h.renumber.get(r, r)) for n, h in staged.items() for r in h.own}
    common = set.intersection(*(set(staged[n].own[r]) for r, (n, _) in ranks.items()))
    if not common:
        return Verdict("fallback", None, newest=newest, reason="the survivors' ranks have no staged step in common")
    order = sorted(ranks, key=lambda r: ranks[r][1])  # shard i: the survivor whose new rank is the i-th
    writes: dict[int, list[Write]] = {}
    for index, rank in enumerate(order):
        writes.setdefault(ranks[rank][0], []).append(Write(rank, index, "own"))
    reason = "replicated state (no staged shard holds a DTensor slice): the survivors hold every distinct byte"
    return Verdict("replicated", max(common), len(order), newest, writes, reason)


def _sharded(holdings: Mapping[int, Holding], staged: Mapping[int, Holding], newest: int) -> Verdict:
    """Every old rank's shard from a live holder: its owner, else the buddy it streamed to."""
    world = max(h.world for h in staged.values())
    sources: dict[int, list[tuple[int, Literal["own", "held"], set[int]]]] = {r: [] for r in range(world)}
    for node, h in holdings.items():
        for rank, steps in h.own.items():
            sources.setdefault(rank, []).append((node, "own", set(steps)))
        for rank, steps in h.held.items():
            sources.setdefault(rank, []).append((node, "held", set(steps)))
    orphans = sorted(r for r, found in sources.items() if not found)
    if orphans:
        reason = f"rank(s) {_ranks(orphans)}: their node and its buddy were both lost"
        return Verdict("fallback", None, world, newest, reason=reason)
    avail = {r: set().union(*(steps for _, _, steps in found)) for r, found in sources.items()}
    common = set.intersection(*avail.values())
    if not common:
        spans = ", ".join(f"rank {r}: {sorted(avail[r])}" for r in sorted(avail)[:4])
        return Verdict("fallback", None, world, newest, reason=f"no step is held for every rank ({spans}…)")
    step = max(common)
    writes: dict[int, list[Write]] = {}
    buddy = False
    for rank in range(world):
        node, source, _ = min((f for f in sources[rank] if step in f[2]), key=lambda f: (f[1] != "own", f[0]))
        buddy = buddy or source == "held"
        writes.setdefault(node, []).append(Write(rank, rank, source))
    how: How = "buddy" if buddy else "own"
    reason = (
        "sharded state: the lost node's shards from its buddy's memory" if buddy else "every shard held by its owner"
    )
    return Verdict(how, step, world, newest, writes, reason)


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + ("…" if len(ranks) > 8 else "")


def verdict_to_wire(v: Verdict) -> dict[str, Any]:
    """Node 0's verdict as the ``scatter0`` exchange carries it: the shared part and each node's writes."""
    shared = {
        "how": v.how,
        "step": v.step,
        "world": v.world,
        "newest": v.newest,
        "reason": v.reason,
        "lost": list(v.lost),
        "committed": v.committed,
    }
    each = {str(n): [[w.rank, w.index, w.source] for w in ws] for n, ws in v.writes.items()}
    return {"all": shared, "each": each}


def verdict_of(shared: Mapping[str, Any], mine: Sequence[Sequence[Any]] | None, node: int) -> Verdict:
    """This node's view of node 0's verdict (its own writes only)."""
    writes = [Write(int(r), int(i), "held" if s == "held" else "own") for r, i, s in (mine or [])]
    step = shared.get("step")
    return Verdict(
        how=shared.get("how", "nothing"),
        step=None if step is None else int(step),
        world=int(shared.get("world") or 0),
        newest=int(shared.get("newest", -1)),
        writes={node: writes} if writes else {},
        reason=str(shared.get("reason", "")),
        lost=tuple(int(r) for r in shared.get("lost") or ()),
        committed=None if shared.get("committed") is None else int(shared["committed"]),
    )
