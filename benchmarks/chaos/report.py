"""The report of a chaos storm (``python -m benchmarks.chaos``): a pure function of what the runs saw.

Definitions (docs/benchmarks.md says the same):

- **committed steps lost**: for each resume (``chaos resumed S``) after a fault, the newest step
  committed when the latest fault before it was injected, less S (0 when S is newer);
- **wall time lost per fault**: the time from a fault to the next one (to the end for the last)
  less the new steps made in it (the newest step reached, so steps done again count as lost) times
  the fault-free run's step time; it adds up to the storm's whole loss;
- **step efficiency**: new steps × the fault-free step time / the storm's duration (first fault to
  the last step); **theoretical**: 1 − R / S, S the mean spacing and R the mean of each fault's
  class median loss among the faults that did not land inside another's recovery — what the storm
  would cost if faults never met;
- **unrecoverable errors**: a host's mlaunch (node 0's as any other's) ended where no fault took
  its host out or ended the job, or ended non-zero after the end step was written, or the job
  stalled; a node lost (node 0 included: the hub moves, issue 45) is recovered when the survivors
  train on, and SIGTERM to all, followed by a whole-job restart that resumes from the newest commit,
  counts as recovered. A fault's cost is measured on whichever hosts step after it: after node
  0's loss, the survivors' next steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.chaos.observe import Event
from benchmarks.chaos.schedule import CLASSES, RESIZES


def pace(events: Sequence[Event]) -> float | None:
    """Seconds per step of a run: the median interval between consecutive steps of each host (pooled: host 0
    is out for a while after its loss, like any host)."""
    gaps = []
    for host in sorted({e.host for e in events if e.kind == "step"}):
        times = sorted((e.values[0], e.stamp) for e in events if e.kind == "step" and e.host == host)
        gaps += [b[1] - a[1] for a, b in zip(times, times[1:], strict=False) if b[0] == a[0] + 1 and b[1] > a[1]]
    return statistics.median(gaps) if gaps else None


def frontier_at(events: Sequence[Event], stamp: float) -> int:
    return max((e.values[0] for e in events if e.kind == "step" and e.stamp <= stamp), default=-1)


def lost_steps(events: Sequence[Event], faults: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per resume after a fault: the step it resumed from, the commit it should have, the steps lost."""
    out = []
    injected = sorted((f["stamp"], f) for f in faults if "done" in f)
    for e in sorted((e for e in events if e.kind == "resumed"), key=lambda e: e.stamp):
        before = [f for stamp, f in injected if stamp < e.stamp]
        if not before:
            continue
        fault = before[-1]
        committed = fault["committed"] if fault["committed"] is not None else -1
        out.append(
            {
                "stamp": e.stamp,
                "resumed": e.values[0],
                "world": e.values[1],
                "committed_before": committed,
                "fault": fault["index"],
                "lost": max(0, committed - e.values[0]),
            }
        )
    return out


def losses(events: Sequence[Event], faults: Sequence[dict[str, Any]], step_time: float, end: float) -> list[float]:
    """Wall time lost in each fault's window (fault → next fault, the last → ``end``)."""
    stamps = [f["stamp"] for f in faults] + [end]
    out = []
    for a, b in zip(stamps, stamps[1:], strict=False):
        progress = max(0, frontier_at(events, b) - frontier_at(events, a))
        out.append((b - a) - progress * step_time)
    return out


def by_class(values: Sequence[float], faults: Sequence[dict[str, Any]], only_isolated: bool = False) -> dict:
    found: dict[str, list[float]] = {}
    for value, fault in zip(values, faults, strict=False):
        if only_isolated and fault["nested"]:
            continue
        found.setdefault(fault["kind"], []).append(value)
    return found


def build(
    storm: dict[str, Any], baseline: dict[str, Any], *, min_nodes: int, spacing: float, seed: int
) -> dict[str, Any]:
    """The report: ``storm`` and ``baseline`` are storm.Record fields plus ``leftovers``."""
    events, faults = storm["events"], [f for f in storm["faults"] if "done" in f]
    step_time = pace(baseline["events"]) or pace(events) or 0.0
    last = max((e.stamp for e in events if e.kind == "step"), default=0.0)
    lost = losses(events, faults, step_time, last)
    classes = by_class(lost, faults)
    isolated = {k: statistics.median(v) for k, v in by_class(lost, faults, True).items() if v}
    resumes = lost_steps(events, faults)
    start = faults[0]["stamp"] if faults else last
    duration = max(1e-9, last - start)
    progress = max(0, frontier_at(events, last) - frontier_at(events, start))
    gaps = [b["stamp"] - a["stamp"] for a, b in zip(faults, faults[1:], strict=False)]
    mean_gap = statistics.mean(gaps) if gaps else spacing
    expected = [isolated.get(f["kind"], statistics.median(classes[f["kind"]])) for f in faults]
    theoretical = 1.0 - (statistics.mean(expected) / mean_gap) if expected else 1.0
    finals = {
        name: [e.values for e in run["events"] if e.kind == "final"]
        for name, run in (("storm", storm), ("baseline", baseline))
    }
    same_membership = not any(f["kind"] in RESIZES for f in faults)
    equal = None
    if same_membership and finals["storm"] and finals["baseline"]:
        equal = finals["storm"][-1] == finals["baseline"][-1]
    return {
        "seed": seed,
        "spacing_s": spacing,
        "min_nodes": min_nodes,
        "faults": {c: sum(1 for f in faults if f["kind"] == c) for c in CLASSES},
        "faults_total": len(faults),
        "faults_not_injected": [
            {"index": f["index"], "kind": f["kind"], "why": f["skipped"]} for f in storm["faults"] if "skipped" in f
        ],
        "nested": sum(1 for f in faults if f["nested"]),
        "unrecoverable": storm["unrecoverable"],
        "whole_job_restarts": storm["restarts"],
        "committed_steps_lost": sum(r["lost"] for r in resumes),
        "resumes": resumes,
        "step_time_s": step_time,
        "lost_s_by_class": {
            k: {"count": len(v), "median": statistics.median(v), "mean": statistics.mean(v)} for k, v in classes.items()
        },
        "lost_s_isolated_median": isolated,
        "mean_gap_s": mean_gap,
        "step_efficiency": progress * step_time / duration,
        "theoretical_efficiency": theoretical,
        "final": finals,
        "same_membership": same_membership,
        "final_equal_to_fault_free": equal,
        "leftovers": storm.get("leftovers", {}),
        "exits": storm["exits"],
    }


def restarts(done: Sequence[dict[str, Any]]) -> str:
    """How many whole-job restarts, and why (``term_all``, ``stalled``, ``unrecoverable``)."""
    whys = sorted({r["why"] for r in done})
    said = ", ".join(f"{why} {sum(r['why'] == why for r in done)}" for why in whys)
    return f"{len(done)} ({said})" if said else "0"


def table(report: dict[str, Any]) -> str:
    head = f"chaos storm: seed {report['seed']}, {report['faults_total']} faults"
    head += f" ({report['nested']} inside another's recovery), mean gap {report['mean_gap_s']:.2f}s"
    lines = [head + f", step {report['step_time_s'] * 1000:.0f} ms"]
    lines.append("class                 faults  lost s (median)  lost s (mean)")
    for kind in CLASSES:
        if kind in report["lost_s_by_class"]:
            c = report["lost_s_by_class"][kind]
            lines.append(f"{kind:20s}  {c['count']:6d}  {c['median']:15.2f}  {c['mean']:13.2f}")
    left = report["leftovers"]
    eff, theo = report["step_efficiency"] * 100, report["theoretical_efficiency"] * 100
    lines += [
        f"unrecoverable errors: {len(report['unrecoverable'])}",
        f"whole-job restarts (SIGTERM to all, stalls, nothing left running): {restarts(report['whole_job_restarts'])}",
        f"committed steps lost: {report['committed_steps_lost']} over {len(report['resumes'])} resumes",
        f"step efficiency {eff:.1f} % vs theoretical {theo:.1f} %",
        f"left on the hosts: processes {left.get('processes')}, shared memory {left.get('shm')}, "
        f"partial checkpoints {left.get('partial')}",
        f"faults not injected: {len(report['faults_not_injected'])}",
    ]
    if report["same_membership"]:
        lines.append(f"final parameters equal to the fault-free run's: {report['final_equal_to_fault_free']}")
    return "\n".join(lines)
