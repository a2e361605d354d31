"""A rank that trains nothing (no torch): it marks when it started, then sleeps or dies as told.

For many real agents on one machine (``tests/many_agents.py``): each attempt writes
``<MARKS>/start-<rank>-<attempt>`` (its wall-clock start). In attempt 0 rank ``KILL_RANK``
waits for ``<MARKS>/go`` (every rank has started), marks ``<MARKS>/killed`` and SIGKILLs
itself; the others sleep ``RUN`` seconds (the job-wide failure stops them first). Later
attempts sleep ``RUN_AGAIN`` seconds and exit 0.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

marks = Path(os.environ["MARKS"])
rank = int(os.environ["RANK"])
attempt = int(os.environ.get("MLAUNCH_RESTART_COUNT", "0"))


def mark(name: str) -> None:
    """``<MARKS>/<name>`` holding the time now, whole when it appears (a reader never sees it half-written)."""
    (marks / f".{name}").write_text(f"{time.time()}\n")
    os.replace(marks / f".{name}", marks / name)


mark(f"start-{rank}-{attempt}")
if attempt == 0 and rank == int(os.environ.get("KILL_RANK", "-1")):
    while not (marks / "go").exists():
        time.sleep(0.05)
    mark("killed")
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(float(os.environ.get("RUN", "300") if attempt == 0 else os.environ.get("RUN_AGAIN", "2")))
