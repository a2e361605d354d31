"""A job's life as the timeline draws it, from what every node's mlaunch already writes (pure: events in, model out).

Sources, all optional but the events: ``<log_dir>/events.jsonl`` of one node or of every node
(a shared log directory, or each node's file gathered into one place), and ``status.json`` for
a job still running (its newest steps, its phase). ``progress`` events (``observer.progress_every``)
give the steps over time; every other event becomes a mark (a moment) or a span (a stretch) on
the lane of the node it hit, or on the whole job:

- faults by class (``faults.fault_class``) at the moment mlaunch detected them, on the node and
  rank hit; a hang also as the stretch from the rank's last progress to its detection, a lost
  node from the moment it went silent;
- restarts (the whole job), resumes (the first steps of the next attempt, with the step),
  membership changes (nodes before → after, who left or joined and why);
- commits: the ranks' own saves, mlaunch's flash saves after a failure, its background persist;
- stragglers (from the report to the recovery), health checks, warnings (recomputed, started over);
- the recovery after each fault: from the last step before it to the first step after, whose
  sum per class is what each kind of fault cost (``costs``);
- the goodput breakdown: the ``end`` event's figures, or while the job runs an estimate rebuilt
  from the events with the same arithmetic (``goodput.Goodput``).

Only the newest run in the files is drawn: a log directory keeps every run's events.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchers.observe import goodput
from launchers.observe.events_log import EVENTS_FILE, read_events
from launchers.observe.faults import fault_class, restart_cause, where_hit
from launchers.observe.status_file import STATUS_FILE

ENDS = ("failure", "hang", "regroup", "stop")  # events that end an attempt
LIVE_PHASES = ("running", "restarting", "starting", "health check", "waiting to join")
STALE = 30.0  # seconds: a status view older than this is not a running job's


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
    """One stretch on a lane (``node`` None: the whole job): a hang, a straggler, a recovery."""

    start: float
    end: float
    kind: str
    node: int | None
    label: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Timeline:
    job: str
    t0: float
    t1: float
    nodes: list[int]
    steps: dict[int, list[tuple[float, int, int]]]  # node → (time, the newest step all its ranks finished, attempt)
    rank_steps: dict[int, list[tuple[float, int, int]]]  # rank → (time, step, attempt)
    rank_nodes: dict[int, int]
    marks: list[Mark]
    spans: list[Span]
    goodput: dict[str, Any] | None  # the end event's figures, or the live estimate
    estimated: bool  # goodput rebuilt from the events (the job has no end event yet)
    costs: dict[str, tuple[int, float]]  # fault class → (how many, seconds without steps after them)
    phase: str  # finished, failed, stopped, running...
    exit_code: int | None = None

    @property
    def running(self) -> bool:
        return self.phase in LIVE_PHASES

    def faults(self) -> list[Mark]:
        return [m for m in self.marks if m.detail.get("event") in ("failure", "hang", "stop", "node_loss")]


# ----------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------


def gather(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every event (deduplicated, by time) and every status view under ``paths`` (directories or events files)."""
    seen: set[str] = set()
    events: list[dict[str, Any]] = []
    statuses: list[dict[str, Any]] = []
    for path in paths:
        files = [path] if path.is_file() else sorted(path.rglob(EVENTS_FILE))
        for file in files:
            for event in read_events(file):
                key = json.dumps(event, sort_keys=True)
                if key not in seen and isinstance(event.get("time"), (int, float)):
                    seen.add(key)
                    events.append(event)
            status = file.parent / STATUS_FILE
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(status.read_text(encoding="utf-8"))
                if isinstance(data, dict):
                    statuses.append(data)
    events.sort(key=lambda e: e["time"])
    return events, statuses


def newest_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the newest run: after the last ``end`` that came before the newest first attempt's start."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "start" and e.get("attempt") == 0]
    if not starts:
        return events
    first = starts[-1]
    ends = [i for i, e in enumerate(events[:first]) if e.get("event") == "end"]
    return events[ends[-1] + 1 :] if ends else events


# ----------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------


def build(events: list[dict[str, Any]], statuses: list[dict[str, Any]] | None = None, job: str = "") -> Timeline:
    """The timeline of the newest run in ``events`` (sorted by time), with the newest status view for a live job."""
    run = newest_run(events)
    status = _fresh_status(statuses or [], run)
    name = job or next((str(e["job"]) for e in run if e.get("job")), "") or str((status or {}).get("job") or "job")
    if not run:
        return Timeline(name, 0.0, 0.0, [0], {}, {}, {}, [], [], None, False, {}, "no events")
    rank_nodes = _rank_nodes(run, status)
    steps, rank_steps = _steps(run, rank_nodes, status)
    marks, spans = _marks(run, rank_nodes)
    nodes = _nodes(run, rank_nodes, steps, marks)
    t0 = run[0]["time"]
    t1 = max(run[-1]["time"], float((status or {}).get("updated") or 0.0))
    end = _end_event(run)
    phase = _phase(end, status)
    costs, recoveries = _costs(run, steps, rank_nodes)
    spans += recoveries
    figures = {k: v for k, v in end.items() if k not in ("time", "event", "node", "job")} if end else None
    estimated = figures is None
    if figures is None:
        figures = _estimate(run, steps, t1)
    return Timeline(
        job=name,
        t0=t0,
        t1=max(t1, t0 + 1.0),
        nodes=nodes,
        steps=steps,
        rank_steps=rank_steps,
        rank_nodes=rank_nodes,
        marks=marks,
        spans=spans,
        goodput=figures,
        estimated=estimated,
        costs=costs,
        phase=phase,
        exit_code=end.get("exit_code") if end else None,
    )


def load(paths: list[Path], job: str = "") -> Timeline:
    events, statuses = gather(paths)
    return build(events, statuses, job)


def _fresh_status(statuses: list[dict[str, Any]], run: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest whole-job status view written during this run."""
    since = run[0]["time"] if run else 0.0
    fresh = [s for s in statuses if float(s.get("updated") or 0.0) >= since and isinstance(s.get("nodes"), list)]
    fresh.sort(key=lambda s: (s.get("scope", "job") != "node", float(s.get("updated") or 0.0)))
    return fresh[-1] if fresh else None


def _rank_nodes(run: list[dict[str, Any]], status: dict[str, Any] | None) -> dict[int, int]:
    found: dict[int, int] = {}
    for e in run:
        if e.get("event") == "progress" and isinstance(e.get("node"), int):
            for rank in e.get("steps") or {}:
                with contextlib.suppress(ValueError):
                    found[int(rank)] = e["node"]
        node, rank = where_hit(e, {})
        if node is not None and rank is not None and "label" in e:
            found.setdefault(rank, node)
    for n in (status or {}).get("nodes", []):
        for r in n.get("ranks", []):
            if isinstance(r.get("rank"), int) and isinstance(n.get("index"), int):
                found.setdefault(r["rank"], n["index"])
    return found


def _steps(
    run: list[dict[str, Any]], rank_nodes: dict[int, int], status: dict[str, Any] | None
) -> tuple[dict[int, list[tuple[float, int, int]]], dict[int, list[tuple[float, int, int]]]]:
    by_node: dict[int, list[tuple[float, int, int]]] = {}
    by_rank: dict[int, list[tuple[float, int, int]]] = {}
    for e in run:
        if e.get("event") != "progress" or not isinstance(e.get("node"), int):
            continue
        attempt = e.get("attempt") if isinstance(e.get("attempt"), int) else 0
        ranks = {int(k): v for k, v in (e.get("steps") or {}).items() if isinstance(v, int)}
        if ranks:
            by_node.setdefault(e["node"], []).append((e["time"], min(ranks.values()), attempt))
            for rank, step in ranks.items():
                by_rank.setdefault(rank, []).append((e["time"], step, attempt))
    if status is not None and status.get("phase") in LIVE_PHASES:  # a running job: its newest steps too
        when = float(status.get("updated") or 0.0)
        attempt = int(status.get("attempt") or 0)
        for n in status.get("nodes", []):
            got = [r["step"] for r in n.get("ranks", []) if isinstance(r.get("step"), int)]
            if got and isinstance(n.get("index"), int):
                by_node.setdefault(n["index"], []).append((when, min(got), attempt))
            for r in n.get("ranks", []):
                if isinstance(r.get("step"), int) and isinstance(r.get("rank"), int):
                    by_rank.setdefault(r["rank"], []).append((when, r["step"], attempt))
    return by_node, by_rank


def _nodes(
    run: list[dict[str, Any]], rank_nodes: dict[int, int], steps: dict[int, list[Any]], marks: list[Mark]
) -> list[int]:
    nodes = set(steps) | set(rank_nodes.values()) | {m.node for m in marks if m.node is not None}
    nodes |= {e["node"] for e in run if isinstance(e.get("node"), int)}
    return sorted(nodes) or [0]


def _short(event: dict[str, Any], cls: str, rank: int | None) -> str:
    who = f"rank {rank}" if rank is not None else ""
    if cls == "sigkill":
        return f"kill -9 {who}".strip()
    if cls == "hang":
        return f"hang {who}".strip()
    if cls == "signal":
        return f"signal {event.get('signal')} {who}".strip()
    if cls == "exit":
        return f"exit {event.get('exit_code')} {who}".strip()
    if cls == "node_lost":
        return "node lost"
    if cls == "stop":
        return "stop"
    return cls


def _marks(run: list[dict[str, Any]], rank_nodes: dict[int, int]) -> tuple[list[Mark], list[Span]]:
    marks: list[Mark] = []
    spans: list[Span] = []
    last_progress: dict[int, float] = {}  # rank → time of the progress event that last showed it advancing
    last_step: dict[int, int] = {}
    slow: dict[int, dict[str, Any]] = {}  # rank → its straggler event
    resume_due: int | None = None  # the attempt whose first steps are a resume
    seen: set[tuple[Any, ...]] = set()
    for e in run:
        kind = e.get("event")
        t = e["time"]
        once = _same_fact(e, rank_nodes)
        if once is not None:  # every node writes its own line of a job-wide fact: one mark
            if once in seen:
                continue
            seen.add(once)
        if kind == "progress":
            for key, step in (e.get("steps") or {}).items():
                rank = int(key)
                if step != last_step.get(rank):
                    last_step[rank], last_progress[rank] = step, t
            if resume_due is not None and e.get("attempt") == resume_due:
                low = min((v for v in (e.get("steps") or {}).values() if isinstance(v, int)), default=None)
                marks.append(Mark(t, "resume", None, f"resumed, step {low}", e))
                resume_due = None
            continue
        cls = fault_class(e)
        if kind in ("failure", "hang", "stop"):
            node, rank = where_hit(e, rank_nodes)
            assert cls is not None
            marks.append(Mark(t, cls, node, _short(e, cls, rank), e, rank))
            if kind == "hang" and rank is not None and rank in last_progress:
                spans.append(Span(last_progress[rank], t, "hang", node, f"rank {rank}: no progress", e))
        elif kind == "restart":
            marks.append(Mark(t, "restart", None, f"restart (attempt {e.get('attempt')})", e))
        elif kind == "start":
            if e.get("attempt"):
                resume_due = e["attempt"]
        elif kind == "checkpoint":
            source = e.get("source") or "ranks"
            marks.append(Mark(t, f"commit_{source}", None, f"commit step {e.get('step')} ({source})", e))
        elif kind == "membership":
            label = f"nodes {e.get('nodes_before')} → {e.get('nodes_after')}"
            marks.append(Mark(t, "membership", None, label, e))
            for left in e.get("left") or []:
                node = left.get("node")
                marks.append(Mark(t, "node_left", node, f"node {node} left", e))
                silent = left.get("silent_s")
                if isinstance(silent, (int, float)) and silent > 0:
                    spans.append(Span(t - silent, t, "silent", node, f"node {node} silent {silent:.1f}s", e))
            for joined in e.get("joined") or []:
                node = joined.get("node")
                marks.append(Mark(t, "node_joined", node, f"node {node} joined", e))
        elif kind == "straggler":
            rank = e.get("rank")
            if isinstance(rank, int):
                slow[rank] = e
            marks.append(Mark(t, "straggler", e.get("node"), f"straggler rank {rank}", e, rank))
        elif kind == "straggler_recovered":
            rank = e.get("rank")
            began = slow.pop(rank, None) if isinstance(rank, int) else None
            if began is not None:
                spans.append(Span(began["time"], t, "straggler", e.get("node"), f"rank {rank} slow", began))
        elif kind == "node_loss":
            marks.append(Mark(t, "node_loss", e.get("node"), f"machine loss: {e.get('how')}", e))
        elif kind in ("recomputed", "started_over"):
            marks.append(Mark(t, "warning", None, kind.replace("_", " "), e))
        elif kind == "injected":  # a fault a test harness injected (benchmarks/chaos_png.py), as it says
            host = e.get("host")
            node = host if isinstance(host, int) and host >= 0 else None
            marks.append(Mark(t, "injected", node, f"injected: {e.get('fault')}", e))
        elif kind == "health":
            marks.append(Mark(t, "health", None, "health check", e))
        elif kind == "end":
            marks.append(Mark(t, "end", None, f"end (exit {e.get('exit_code')})", e))
    end = run[-1]["time"]
    for rank, began in slow.items():  # still slow at the end
        spans.append(Span(began["time"], end, "straggler", began.get("node"), f"rank {rank} slow", began))
    return marks, spans


def _same_fact(e: dict[str, Any], rank_nodes: dict[int, int]) -> tuple[Any, ...] | None:
    """What makes two nodes' events one fact (a failure of rank 3 in attempt 2, a restart to attempt 3); None: own."""
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


def _costs(
    run: list[dict[str, Any]], steps: dict[int, list[tuple[float, int, int]]], rank_nodes: dict[int, int]
) -> tuple[dict[str, tuple[int, float]], list[Span]]:
    """Per fault class: how many, and the seconds from the last step before each to the first step after.

    The ends of one recovery (a failure, then the membership change that explains it) are one
    cost, of the class ``faults.restart_cause`` gives them (as ``mlaunch_restarts_total`` counts it).
    """
    times = sorted({t for series in steps.values() for t, _, _ in series})
    advancing = _advancing(steps)
    groups: list[tuple[float, float, list[dict[str, Any]]]] = []  # (last step before, first step after, ends)
    for e in run:
        if e.get("event") not in ENDS + ("membership",) or fault_class(e) == "stop":
            continue
        if e.get("event") != "regroup" and fault_class(e) is None:
            continue
        t = e["time"]
        if groups and t <= groups[-1][1]:  # in the recovery already counted
            groups[-1][2].append(e)
            continue
        before = max((x for x in advancing if x <= t), default=None)
        after = next((x for x in times if x > t), None)
        if before is not None and after is not None:
            groups.append((before, after, [e]))
    costs: dict[str, tuple[int, float]] = {}
    spans: list[Span] = []
    for before, after, ends in groups:
        cls = restart_cause(ends) or "membership"
        count, seconds = costs.get(cls, (0, 0.0))
        costs[cls] = (count + 1, seconds + (after - before))
        spans.append(Span(before, after, f"recovery_{cls}", None, f"{after - before:.1f}s without steps", ends[0]))
    return costs, spans


def _advancing(steps: dict[int, list[tuple[float, int, int]]]) -> list[float]:
    """The times a node's step was seen higher than at its sample before (the job was making progress)."""
    out: list[float] = []
    for series in steps.values():
        for (_, a, _), (t, b, _) in zip(series, series[1:], strict=False):
            if b > a:
                out.append(t)
    return sorted(out)


def _end_event(run: list[dict[str, Any]]) -> dict[str, Any] | None:
    ends = [e for e in run if e.get("event") == "end"]
    if not ends:
        return None
    node0 = [e for e in ends if e.get("node") in (None, 0)]
    return max(node0 or ends, key=lambda e: float(e.get("wall_s") or 0.0))


def _phase(end: dict[str, Any] | None, status: dict[str, Any] | None) -> str:
    if end is not None:
        code = end.get("exit_code")
        return "finished" if code == 0 else "stopped" if isinstance(code, int) and code > 128 else "failed"
    if status is not None:
        return str(status.get("phase") or "running")
    return "running"


def _estimate(run: list[dict[str, Any]], steps: dict[int, list[tuple[float, int, int]]], now: float) -> dict[str, Any]:
    """The goodput figures of a job without an end event, by the end report's own arithmetic."""
    clock = goodput.Goodput(run[0]["time"])
    attempts: dict[int, goodput.AttemptTimes] = {}
    for e in run:
        attempt = e.get("attempt")
        kind = e.get("event")
        if kind == "start" and isinstance(attempt, int) and attempt not in attempts:
            attempts[attempt] = clock.begin(attempt, e["time"])
        elif kind == "progress" and attempt in attempts:
            low = min((v for v in (e.get("steps") or {}).values() if isinstance(v, int)), default=-1)
            attempts[attempt].note(low, e["time"], low, e["time"], 0.0)
        elif kind in ENDS and attempt in attempts and attempts[attempt].ended is None:
            attempts[attempt].ended = e["time"]
        elif kind == "checkpoint" and isinstance(e.get("step"), int):
            clock.committed(e["step"], e.get("source") or "ranks")
        elif kind == "membership":
            clock.membership_changed()
    return clock.figures(now)
