"""``mlaunch status`` on a node other than node 0: it asks node 0 for the whole view, through that node's mlaunch.

Only node 0 keeps every node's status entry (the entries go up, nothing is pushed down every
second: at thousands of nodes that would be the plane's whole cost). Every other node's
``status.json`` holds its own ranks and node 0's summary of the job (phase, stragglers,
newest committed step), marked ``"scope": "node"``. ``mlaunch status`` there touches
``<log_dir>/.status-request``; the node's running mlaunch sees it within half a second,
asks node 0's hub once (``request_view``) and writes the whole view (``"scope": "job"``);
the command waits up to ``ANSWER_WAIT`` seconds for it, else shows what the node has.

On a log directory every node shares, node 0's whole view is the file: another node writes
its own only when no fresh whole view from another node is there.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launchers.control import JobEvents

REQUEST_FILE = ".status-request"
ANSWER_WAIT = 3.0  # seconds `mlaunch status` waits for the running mlaunch to bring node 0's whole view
FRESH = 5.0  # seconds a whole view written by another node keeps a node's own view off a shared file
WATCH_FOR_ANSWER = 4.0  # seconds after a request the running mlaunch writes the view as soon as it grew


def scope_of(path: Path) -> tuple[str, float] | None:
    """(``"job"`` | ``"node"``, age in seconds) of a status file, read from its first bytes; None if unreadable."""
    try:
        with open(path, "rb") as file:
            head = file.read(200).decode("utf-8", "replace")
        age = time.time() - os.stat(path).st_mtime
    except OSError:
        return None
    scope = "node" if '"scope": "node"' in head else "job"
    return scope, age


def ask(log_dir: Path, status_path: Path, wait: float = ANSWER_WAIT) -> None:
    """``mlaunch status``: when the file holds one node's view of a live job, ask for the whole one and wait."""
    seen = scope_of(status_path)
    if seen is None or seen[0] != "node" or seen[1] > FRESH * 2:
        return  # node 0's (or a simulation's) whole view already, or no mlaunch is writing it
    asked = time.time()
    with contextlib.suppress(OSError):
        (log_dir / REQUEST_FILE).write_text(f"{asked}\n")
    end = time.monotonic() + wait
    while time.monotonic() < end:
        time.sleep(0.1)
        now = scope_of(status_path)
        if now is not None and now[0] == "job" and time.time() - now[1] >= asked - 0.05:
            return


class StatusRelay:
    """The running mlaunch's side (nodes other than 0): a request seen → node 0 asked → the view written at once."""

    def __init__(self, log_dir: Path, events: JobEvents) -> None:
        self.request = log_dir / REQUEST_FILE
        self.status_path = log_dir / "status.json"
        self.events = events
        self._served = time.time()  # a request older than this mlaunch is not for it
        self._until = 0.0
        self._size = 0

    def due(self, now: float) -> bool:
        """True when the whole view just arrived and should be written now (called twice a second)."""
        with contextlib.suppress(OSError):
            asked = os.stat(self.request).st_mtime
            if asked > self._served:
                self._served = asked
                self._until = now + WATCH_FOR_ANSWER
                self._size = len(self.events.view())
                self.events.request_view()
        if now < self._until and len(self.events.view()) > self._size:
            self._until = 0.0
            return True
        return False

    def may_write(self, status: dict[str, Any]) -> bool:
        """One node's view does not replace a fresh whole view another node wrote (a shared log directory)."""
        if status.get("scope") != "node":
            return True
        seen = scope_of(self.status_path)
        return seen is None or seen[0] == "node" or seen[1] > FRESH
