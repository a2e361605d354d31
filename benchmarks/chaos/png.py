"""A chaos storm as a picture, drawn by mlaunch's own timeline (``mlaunch timeline``).

The job's events (every host writes the one log directory) give the lanes, steps, faults as mlaunch
saw them, restarts, resumes, commits, membership changes and the goodput breakdown
(``launchers.observe.timeline_*``); each fault the harness injected is added as an ``injected`` mark
on its host's lane (its class in the hover), so a fault mlaunch never had to act on (a link flap
under ``node_timeout``, a slow node) shows too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launchers.observe import timeline_model
from launchers.observe.timeline_draw import save_png


def draw(path: Path, log_dir: Path, faults: Sequence[dict[str, Any]]) -> None:
    """``faults``: the harness's injected faults (``stamp`` on time.monotonic(), ``kind``, ``host``: -1 for all)."""
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
    events, statuses = timeline_model.gather([log_dir])
    if not events:
        return
    timeline = timeline_model.build(sorted(events + injected, key=lambda e: e["time"]), statuses)
    save_png(timeline, path)
