"""``<log_dir>/events.jsonl``: one JSON object per line for everything that happened to the job.

Every node's mlaunch appends its own events (``node`` says which); on a shared log directory
the lines of all nodes interleave, each whole (one ``write`` of one line, ``O_APPEND``).
Writing never raises: a full disk must not turn a training run into a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


class EventLog:
    """Appends events for one node's mlaunch (``node`` None: a simulation writing for every node)."""

    def __init__(self, log_dir: Path, node: int | None, job: str = "") -> None:
        self.path = log_dir / EVENTS_FILE
        self.node = node
        self.job = job
        self.on_write: Callable[[dict[str, Any]], None] | None = None  # node 0's metrics count what is written

    def write(self, event: str, *, node: int | None = None, **details: Any) -> dict[str, Any]:
        """Append one event; returns it (the goodput report reuses it)."""
        record: dict[str, Any] = {"time": round(time.time(), 3), "event": event}
        where = self.node if node is None else node
        if where is not None:
            record["node"] = where
        if self.job:
            record["job"] = self.job
        record.update({k: v for k, v in details.items() if v is not None})
        line = json.dumps(record, default=str, ensure_ascii=False) + "\n"
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        if self.on_write is not None:
            self.on_write(record)
        return record


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every well-formed event of ``path`` (a torn last line is skipped)."""
    events = []
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as fh:
        for line in fh:
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    events.append(item)
    return events
