"""``progress`` events: each node's ranks' steps over time, the timeline's step lines (``timeline_model``).

The progress files hold only each rank's newest report, and status.json only the newest view;
without these events a finished job's steps over time would be lost. About a hundred per run,
whatever its length: at least ``PROGRESS_MIN`` and at most ``PROGRESS_MAX`` seconds apart, and
only when a node's steps changed (an hour-long run writes ~150 short lines per node).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchers.observe.events_log import EventLog
    from launchers.observe.steps import StepTracker

PROGRESS_MIN, PROGRESS_MAX = 0.5, 30.0  # seconds between a node's `progress` events


def progress_every(elapsed: float) -> float:
    """Seconds between a node's ``progress`` events, ``elapsed`` seconds into the run (pure)."""
    return min(PROGRESS_MAX, max(PROGRESS_MIN, elapsed / 100.0))


class ProgressLog:
    """Writes a ``progress`` event per node whose ranks' steps changed, when one is due."""

    def __init__(self, log: EventLog, started: float) -> None:
        self.log = log
        self.started = started
        self._next = 0.0
        self._seen: dict[int, dict[str, int]] = {}

    def sample(self, tracker: StepTracker, attempt: int, *, force: bool = False) -> None:
        """``force``: an attempt's end (its last steps are where its line ends)."""
        now = time.time()
        if not force and now < self._next:
            return
        self._next = now + progress_every(now - self.started)
        by_node: dict[int, dict[str, int]] = {}
        reached: dict[int, float] = {}  # node → its ranks' newest report: when these steps were reached
        for r in tracker.ranks.values():
            if r.step >= 0:
                by_node.setdefault(r.node, {})[str(r.rank)] = r.step
                reached[r.node] = max(reached.get(r.node, 0.0), r.last_wall)
        for node, steps in sorted(by_node.items()):
            if steps != self._seen.get(node):
                self._seen[node] = steps
                at = round(reached[node], 3) if reached.get(node) else None
                self.log.write("progress", node=node, attempt=attempt, steps=steps, at=at)
