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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.observe import timeline_costs
from launchers.observe.events_log import EVENTS_FILE, read_events
from launchers.observe.faults import where_hit
from launchers.observe.status_file import STATUS_FILE
from launchers.observe.timeline_marks import Mark, MarkReader, Span, step_time

__all__ = ["Mark", "Span", "Timeline", "build", "gather", "load", "newest_run"]

STALE = 30.0  # seconds: a status view older than this, with no end event, is not a running job's
UNFINISHED = "unfinished (no end event: mlaunch was killed?)"


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
        return self.phase == "running"

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


def build(
    events: list[dict[str, Any]], statuses: list[dict[str, Any]] | None = None, job: str = "", now: float | None = None
) -> Timeline:
    """The timeline of the newest run in ``events`` (sorted by time), with the newest status view for a live job.

    A run without an ``end`` event is running while a status view of it was updated in the last
    ``STALE`` seconds before ``now`` (default: the clock), else unfinished (its mlaunch was killed).
    """
    run = newest_run(events)
    status = _fresh_status(statuses or [], run)
    name = job or next((str(e["job"]) for e in run if e.get("job")), "") or str((status or {}).get("job") or "job")
    if not run:
        return Timeline(name, 0.0, 0.0, [0], {}, {}, {}, [], [], None, False, {}, "no events")
    end = _end_event(run)
    updated = float((status or {}).get("updated") or 0.0)
    live = end is None and (time.time() if now is None else now) - updated < STALE
    phase = _phase(end, live)
    rank_nodes = _rank_nodes(run, status)
    steps, rank_steps = _steps(run, rank_nodes, status if live else None)
    marks, spans = MarkReader(rank_nodes).read(run)
    nodes = _nodes(run, rank_nodes, steps, marks)
    t0 = run[0]["time"]
    t1 = max(run[-1]["time"], updated)
    costs, recoveries = timeline_costs.costs(run, steps)
    spans += recoveries
    figures = {k: v for k, v in end.items() if k not in ("time", "event", "node", "job")} if end else None
    estimated = figures is None
    if figures is None:
        figures = timeline_costs.estimate(run, t1)
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
        attempt: int = e["attempt"] if isinstance(e.get("attempt"), int) else 0
        ranks = {int(k): v for k, v in (e.get("steps") or {}).items() if isinstance(v, int)}
        if ranks:
            when = step_time(e)
            by_node.setdefault(e["node"], []).append((when, min(ranks.values()), attempt))
            for rank, step in ranks.items():
                by_rank.setdefault(rank, []).append((when, step, attempt))
    if status is not None:  # a running job: its newest steps too
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


def _end_event(run: list[dict[str, Any]]) -> dict[str, Any] | None:
    ends = [e for e in run if e.get("event") == "end"]
    if not ends:
        return None
    node0 = [e for e in ends if e.get("node") in (None, 0)]
    return max(node0 or ends, key=lambda e: float(e.get("wall_s") or 0.0))


def _phase(end: dict[str, Any] | None, live: bool) -> str:
    if end is not None:
        code = end.get("exit_code")
        return "finished" if code == 0 else "stopped" if isinstance(code, int) and code > 128 else "failed"
    return "running" if live else UNFINISHED
