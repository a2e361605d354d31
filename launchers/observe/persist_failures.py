"""mlaunch's own writes for the ranks that failed (a full disk...): counted by source, the last one kept.

Nothing is committed by a failed write and the job goes on (the background persist tries the next multiple
of ``persist_every``; a restart resumes from the newest committed step), so the count is what tells a user
their checkpoints stopped landing: ``status.json``'s ``persist_failures`` and the node's entry show it.
"""

from __future__ import annotations

import time
from typing import Any


class PersistFailures:
    """The counts by source (``flash``, ``background``) and the newest failure, for the status view."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last: dict[str, Any] | None = None

    def add(self, source: str, step: int | None, error: str) -> None:
        self.counts[source] = self.counts.get(source, 0) + 1
        self.last = {"source": source, "step": step, "error": error, "time": round(time.time(), 3)}

    def status(self) -> dict[str, Any]:
        """``{"counts": {...}, "last": {...}}``; empty while nothing failed."""
        return {"counts": dict(self.counts), "last": self.last} if self.counts else {}
