"""Append one JSON line per call to $FAKE_TASKD_RECORD (atomic O_APPEND writes)."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def record(call: str, **data: Any) -> None:
    path = os.environ.get("FAKE_TASKD_RECORD")
    if not path:
        return
    line = json.dumps({"call": call, "pid": os.getpid(), "time": time.time(), **data}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
