"""What each fault class cost (the seconds without steps after it), and a running job's goodput (pure).

A recovery runs from the last step before a fault to the first step of the next attempt. The
ends of one recovery (a failure, then the membership change that explains it; each node's own
line of it) are one cost, of the class ``faults.restart_cause`` gives them — the rule
``mlaunch_restarts_total`` counts by. A job without an ``end`` event yet gets its goodput by the
end report's own arithmetic (``goodput.Goodput``), from its events.
"""

from __future__ import annotations

from typing import Any

from launchers.observe import goodput
from launchers.observe.faults import fault_class, restart_cause
from launchers.observe.timeline_marks import Span, step_time

ENDS = ("failure", "hang", "regroup", "stop")  # events that end an attempt
Steps = dict[int, list[tuple[float, int, int]]]  # node → (time, step, attempt)


def costs(run: list[dict[str, Any]], steps: Steps) -> tuple[dict[str, tuple[int, float]], list[Span]]:
    """Per fault class: how many, and the seconds from the last step before each to the first step after."""
    firsts = _first_steps(steps)
    advancing = _advancing(steps)
    groups: list[tuple[float, float, list[dict[str, Any]]]] = []  # (last step before, first step after, ends)
    for e in run:
        kind = e.get("event")
        if kind not in ENDS + ("membership",) or fault_class(e) == "stop":
            continue
        if kind != "regroup" and fault_class(e) is None:
            continue
        t = e["time"]
        if groups and t <= groups[-1][1]:  # in the recovery already counted
            groups[-1][2].append(e)
            continue
        attempt: int = e["attempt"] if isinstance(e.get("attempt"), int) else -1
        before = max((x for x in advancing if x <= t), default=None)
        after = next((x for x, a in firsts if x > t and a > attempt), None)  # the next attempt's first steps
        if before is not None and after is not None:
            groups.append((before, after, [e]))
    found: dict[str, tuple[int, float]] = {}
    spans: list[Span] = []
    for before, after, ends in groups:
        cls = restart_cause(ends) or "membership"
        count, seconds = found.get(cls, (0, 0.0))
        found[cls] = (count + 1, seconds + (after - before))
        spans.append(Span(before, after, f"recovery_{cls}", None, f"{after - before:.1f}s without steps", ends[0]))
    return found, spans


def _first_steps(steps: Steps) -> list[tuple[float, int]]:
    """(time, attempt) of each attempt's first step sample, on any node, by time."""
    first: dict[int, float] = {}
    for series in steps.values():
        for when, _, attempt in series:
            first[attempt] = min(first.get(attempt, when), when)
    return sorted((when, attempt) for attempt, when in first.items())


def _advancing(steps: Steps) -> list[float]:
    """The times a node's step was seen higher than at its sample before (the job was making progress)."""
    out: list[float] = []
    for series in steps.values():
        for (_, a, _), (t, b, _) in zip(series, series[1:], strict=False):
            if b > a:
                out.append(t)
    return sorted(out)


def estimate(run: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The goodput figures of a job without an end event, by the end report's own arithmetic."""
    clock = goodput.Goodput(run[0]["time"])
    attempts: dict[int, goodput.AttemptTimes] = {}
    for e in run:
        attempt = e.get("attempt")
        kind = e.get("event")
        if kind == "start" and isinstance(attempt, int) and attempt not in attempts:
            attempts[attempt] = clock.begin(attempt, e["time"])
        elif kind == "progress" and isinstance(attempt, int) and attempt in attempts:
            low = min((v for v in (e.get("steps") or {}).values() if isinstance(v, int)), default=-1)
            attempts[attempt].note(low, step_time(e), low, step_time(e), 0.0)
        elif kind in ENDS and isinstance(attempt, int) and attempt in attempts and attempts[attempt].ended is None:
            attempts[attempt].ended = e["time"]
        elif kind == "checkpoint" and isinstance(e.get("step"), int):
            clock.committed(e["step"], e.get("source") or "ranks")
        elif kind == "membership":
            clock.membership_changed()
    return clock.figures(now)
