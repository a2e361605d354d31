"""The timeline's marks (moments) and spans (stretches), read from a run's events in order (pure).

Each event kind has its reader (``MarkReader.on_<kind>``); an event every node wrote of one
job-wide fact (a failure of rank 3 in attempt 2, a restart, a commit) becomes one mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launchers.observe.faults import fault_class, where_hit


@dataclass(frozen=True)
class Mark:
    """One moment: ``kind`` (a fault class, restart, resume, commit...), on ``node``'s lane (None: the whole job)."""

    time: float
    kind: str
    node: int | None
    label: str
    detail: dict[str, Any]
    rank: int | None = None


@dataclass(frozen=True)
class Span:
    """One stretch on a lane (``node`` None: the whole job): a hang, a straggler, a silence, a recovery."""

    start: float
    end: float
    kind: str
    node: int | None
    label: str
    detail: dict[str, Any] = field(default_factory=dict)


def step_time(e: dict[str, Any]) -> float:
    """When a ``progress`` event's steps were reached (``at``: the ranks' newest report), else when it was written."""
    at = e.get("at")
    return float(at) if isinstance(at, (int, float)) else float(e["time"])


def same_fact(e: dict[str, Any], rank_nodes: dict[int, int]) -> tuple[Any, ...] | None:
    """What makes two nodes' events one fact; None: an event of its own node only."""
    kind = e.get("event")
    if kind in ("failure", "hang"):
        return (kind, e.get("attempt"), where_hit(e, rank_nodes))
    if kind in ("restart", "membership", "stop", "regroup"):
        return (kind, e.get("attempt"))
    if kind == "checkpoint":
        return (kind, e.get("step"), e.get("source"))
    if kind == "end":
        return (kind,)
    return None


def short(event: dict[str, Any], cls: str, rank: int | None) -> str:
    """A fault's few words beside its mark."""
    who = f" rank {rank}" if rank is not None else ""
    words = {
        "sigkill": f"kill -9{who}",
        "hang": f"hang{who}",
        "signal": f"signal {event.get('signal')}{who}",
        "exit": f"exit {event.get('exit_code')}{who}",
        "node_lost": "node lost",
        "stop": "stop",
    }
    return words.get(cls, cls)


class MarkReader:
    """Reads a run's events in time order into marks and spans."""

    def __init__(self, rank_nodes: dict[int, int]) -> None:
        self.rank_nodes = rank_nodes
        self.marks: list[Mark] = []
        self.spans: list[Span] = []
        self.last_progress: dict[int, float] = {}  # rank → when its step last advanced
        self.last_step: dict[int, int] = {}
        self.slow: dict[int, dict[str, Any]] = {}  # rank → its straggler event, until it recovers
        self.resume_due: int | None = None  # the attempt whose first steps are a resume
        self.seen: set[tuple[Any, ...]] = set()

    def read(self, run: list[dict[str, Any]]) -> tuple[list[Mark], list[Span]]:
        for e in run:
            once = same_fact(e, self.rank_nodes)
            if once is not None:  # every node writes its own line of a job-wide fact: one mark
                if once in self.seen:
                    continue
                self.seen.add(once)
            handler = getattr(self, f"on_{e.get('event')}", None)
            if handler is not None:
                handler(e, e["time"])
        end = run[-1]["time"] if run else 0.0
        for rank, began in self.slow.items():  # still slow at the end
            self.spans.append(Span(began["time"], end, "straggler", began.get("node"), f"rank {rank} slow", began))
        return self.marks, self.spans

    def add(
        self, t: float, kind: str, node: int | None, label: str, e: dict[str, Any], rank: int | None = None
    ) -> None:
        self.marks.append(Mark(t, kind, node, label, e, rank))

    def on_progress(self, e: dict[str, Any], t: float) -> None:
        t = step_time(e)
        steps = {k: v for k, v in (e.get("steps") or {}).items() if isinstance(v, int)}
        for key, step in steps.items():
            if step != self.last_step.get(int(key)):
                self.last_step[int(key)], self.last_progress[int(key)] = step, t
        if self.resume_due is not None and e.get("attempt") == self.resume_due and steps:
            self.add(t, "resume", None, f"resumed, step {min(steps.values())}", e)
            self.resume_due = None

    def on_failure(self, e: dict[str, Any], t: float) -> None:
        cls = fault_class(e) or "exit"
        node, rank = where_hit(e, self.rank_nodes)
        self.add(t, cls, node, short(e, cls, rank), e, rank)
        if e.get("event") == "hang" and rank is not None and rank in self.last_progress:
            self.spans.append(Span(self.last_progress[rank], t, "hang", node, f"rank {rank}: no progress", e))

    on_hang = on_failure
    on_stop = on_failure

    def on_restart(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "restart", None, f"restart (attempt {e.get('attempt')})", e)

    def on_start(self, e: dict[str, Any], t: float) -> None:
        if e.get("attempt"):
            self.resume_due = e["attempt"]

    def on_checkpoint(self, e: dict[str, Any], t: float) -> None:
        source = e.get("source") or "ranks"
        self.add(t, f"commit_{source}", None, f"commit step {e.get('step')} ({source})", e)

    def on_membership(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "membership", None, f"nodes {e.get('nodes_before')} → {e.get('nodes_after')}", e)
        for left in e.get("left") or []:
            node = left.get("node")
            self.add(t, "node_left", node, f"node {node} left", e)
            silent = left.get("silent_s")
            if isinstance(silent, (int, float)) and silent > 0:
                self.spans.append(Span(t - silent, t, "silent", node, f"node {node} silent {silent:.1f}s", e))
        for joined in e.get("joined") or []:
            self.add(t, "node_joined", joined.get("node"), f"node {joined.get('node')} joined", e)

    def on_straggler(self, e: dict[str, Any], t: float) -> None:
        rank = e.get("rank")
        if isinstance(rank, int):
            self.slow[rank] = e
        self.add(t, "straggler", e.get("node"), f"straggler rank {rank}", e, rank)

    def on_straggler_recovered(self, e: dict[str, Any], t: float) -> None:
        rank = e.get("rank")
        began = self.slow.pop(rank, None) if isinstance(rank, int) else None
        if began is not None:
            self.spans.append(Span(began["time"], t, "straggler", e.get("node"), f"rank {rank} slow", began))

    def on_node_loss(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "node_loss", e.get("node"), f"machine loss: {e.get('how')}", e)

    def on_recomputed(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "warning", None, str(e.get("event")).replace("_", " "), e)

    on_started_over = on_recomputed

    def on_injected(self, e: dict[str, Any], t: float) -> None:
        """A fault a test harness injected (``benchmarks/chaos/png.py``), as it says."""
        host = e.get("host")
        self.add(t, "injected", host if isinstance(host, int) and host >= 0 else None, f"injected: {e.get('fault')}", e)

    def on_kept_in_place(self, e: dict[str, Any], t: float) -> None:
        """In-place recovery (``@elastic.recoverable``): survivors kept their processes for the next attempt."""
        self.add(t, "in_place", None, f"kept in place: {len(e.get('ranks') or [])} rank(s)", e)

    def on_rejoined_in_place(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "in_place", None, f"rejoined in place: {len(e.get('ranks') or [])} rank(s)", e)

    def on_in_place_fallback(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "warning", None, f"in-place fallback: {e.get('reason')}", e)

    def on_health(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "health", None, "health check", e)

    def on_end(self, e: dict[str, Any], t: float) -> None:
        self.add(t, "end", None, f"end (exit {e.get('exit_code')})", e)
