"""A chaos storm as a picture, drawn by mlaunch's own timeline (``mlaunch timeline``).

The job's events (every host writes the one log directory) give the lanes, steps, faults as mlaunch
saw them, restarts, resumes, commits, membership changes and the goodput breakdown
(``launchers.observe.timeline_*``); each fault the harness injected is added as an ``injected`` mark
on its host's lane (its class in the hover), so a fault mlaunch never had to act on (a link flap
under ``node_timeout``, a slow node) shows too.

A storm is several runs of the job: after a fault that ends it by design (SIGTERM to all; node 0's
loss is a shrink since the hub moves) the harness starts every mlaunch again, and each run begins
at attempt 0 and ends with its own ``end`` events. The timeline draws a log directory's newest
run, which would be the storm's last stretch alone; ``joined`` makes the runs one: attempts
numbered on across runs, each earlier run's ends replaced by a ``restart`` at the harness's
whole-job restart, and the goodput computed from the events of the whole storm (an ``end``
event's figures cover its own run only).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launchers.observe import timeline_costs, timeline_model
from launchers.observe.timeline_model import Timeline

WHOLE_JOB_RESTART = "the harness restarted the whole job"


def joined(events: Sequence[dict[str, Any]], restarts: Sequence[float]) -> list[dict[str, Any]]:
    """``events`` (sorted by time) of runs split at ``restarts`` (wall-clock times) as one run of the job."""
    bounds = sorted(restarts)
    out: list[dict[str, Any]] = []
    offset, top, run = 0, -1, 0
    for e in events:
        while run < len(bounds) and e["time"] >= bounds[run]:  # a new run: its attempts go on after the last one's
            offset = top + 1
            out.append({"time": bounds[run], "event": "restart", "attempt": offset, "cause": WHOLE_JOB_RESTART})
            run += 1
        if e.get("event") == "end" and run < len(bounds):
            continue  # an earlier run's end: the restart above stands for it
        if isinstance(e.get("attempt"), int):
            e = {**e, "attempt": e["attempt"] + offset}
            top = max(top, e["attempt"])
        out.append(e)
    return out


def timeline(
    log_dir: Path, faults: Sequence[dict[str, Any]], restarts: Sequence[dict[str, Any]] = ()
) -> Timeline | None:
    """The storm's timeline, or None when mlaunch wrote no event. ``faults``: the harness's injected faults
    (``stamp`` on time.monotonic(), ``kind``, ``host``: -1 for all); ``restarts``: its whole-job restarts
    (``stamp``, ``why``)."""
    events, statuses = timeline_model.gather([log_dir])
    if not events:
        return None
    offset = time.time() - time.monotonic()  # the harness stamps with the monotonic clock, mlaunch with the wall clock
    injected = [
        {
            "time": f["stamp"] + offset,
            "event": "injected",
            "fault": f["kind"],
            "host": f.get("host"),
            "index": f.get("index"),
        }
        for f in faults
    ]
    events = sorted(events + injected, key=lambda e: e["time"])
    if not restarts:
        return timeline_model.build(events, statuses)
    run = joined(events, [r["stamp"] + offset for r in restarts])
    drawn = timeline_model.build(run, statuses)
    return dataclasses.replace(
        drawn,
        job=f"{drawn.job}, {len(restarts) + 1} runs",  # the restarts' marks say why: WHOLE_JOB_RESTART
        goodput=timeline_costs.estimate(run, drawn.t1),  # an end event's figures are its own run's
    )


def draw(path: Path, log_dir: Path, faults: Sequence[dict[str, Any]], restarts: Sequence[dict[str, Any]] = ()) -> None:
    """The storm's PNG at ``path``; nothing when mlaunch wrote no event."""
    drawn = timeline(log_dir, faults, restarts)
    if drawn is not None:
        from launchers.observe.timeline_draw import save_png  # matplotlib: only where a picture is drawn

        save_png(drawn, path)
