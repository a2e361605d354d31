"""``mlaunch status`` on a node other than node 0: it asks node 0 for the whole view, through that node's mlaunch.

Only node 0 keeps every node's status entry (the entries go up, nothing is pushed down every
second: at thousands of nodes that would be the plane's whole cost); node 0's ``status.json``
is the job's view (``"scope": "job"``, as a simulation's). Every other node's holds its own
ranks and node 0's summary of the job (phase, stragglers, newest committed step), marked
``"scope": "node"``. ``mlaunch status`` there touches ``<log_dir>/.status-request``; the
node's running mlaunch sees it within half a second, asks node 0's hub once
(``request_view``) and writes the whole view as node 0 sent it (``"scope": "relay"``); the
command waits up to ``ANSWER_WAIT`` seconds for a file written after it asked, else shows
what the node has. It asks each time (a relayed view is as old as its answer).

On a log directory every node shares, node 0's whole view is the file: another node writes
its own only when no fresh view from node 0 is there.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launchers.control import JobEvents

REQUEST_FILE = ".status-request"
ANSWER_WAIT = 5.0  # seconds `mlaunch status` waits for the running mlaunch to bring node 0's whole view
# (about 1 s on a quiet node; 3 s was passed on a CPU-saturated 2-core machine)
FRESH = 5.0  # seconds a whole view written by another node keeps a node's own view off a shared file
_SCOPE = re.compile(r'"scope": "(\w+)"')
WATCH_FOR_ANSWER = 4.0  # seconds after a request the running mlaunch writes the view as soon as it grew


def scope_of(path: Path) -> tuple[str, float] | None:
    """(scope: ``job``, ``relay`` or ``node``; age in seconds) of a status file, from its head; None: unreadable."""
    try:
        with open(path, "rb") as file:
            head = file.read(200).decode("utf-8", "replace")
        age = time.time() - os.stat(path).st_mtime
    except OSError:
        return None
    found = _SCOPE.search(head)
    return (found.group(1) if found else "job"), age  # a file from before scopes: node 0's whole view


def ask(log_dir: Path, status_path: Path, wait: float = ANSWER_WAIT) -> None:
    """``mlaunch status``: when the file holds one node's view of a live job, ask for the whole one and wait."""
    seen = scope_of(status_path)
    if seen is None or seen[0] == "job" or seen[1] > FRESH * 2:
        return  # node 0's (or a simulation's) view already, or no mlaunch is writing it
    asked = time.time()
    with contextlib.suppress(OSError):
        (log_dir / REQUEST_FILE).write_text(f"{asked}\n")
    end = time.monotonic() + wait
    while time.monotonic() < end:
        time.sleep(0.1)
        now = scope_of(status_path)
        if now is not None and now[0] != "node" and time.time() - now[1] >= asked - 0.05:
            return


class StatusRelay:
    """The running mlaunch's side (nodes other than 0): a request seen → node 0 asked → the view written at once."""

    def __init__(self, log_dir: Path, events: JobEvents) -> None:
        self.request = log_dir / REQUEST_FILE
        self.status_path = log_dir / "status.json"
        self.events = events
        self._served = time.time()  # a request older than this mlaunch is not for it
        self._until = 0.0
        self._stamp = 0.0

    def due(self, now: float) -> bool:
        """True when the whole view just arrived and should be written now (called twice a second)."""
        with contextlib.suppress(OSError):
            asked = os.stat(self.request).st_mtime
            if asked > self._served:
                self._served = asked
                self._until = now + WATCH_FOR_ANSWER
                self._stamp = self.events.view_stamp()
                self.events.request_view()
        if now < self._until and self.events.view_stamp() > self._stamp:  # node 0's answer is here
            self._until = 0.0
            return True
        return False

    def may_write(self, status: dict[str, Any]) -> bool:
        """Another node's file does not replace a fresh one of node 0 (a log directory every node shares)."""
        if status.get("scope") == "job":
            return True
        seen = scope_of(self.status_path)
        return seen is None or seen[0] != "job" or seen[1] > FRESH
