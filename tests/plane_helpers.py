"""Waiting on, and calling at once, the real control-plane agents of the plane tests (membership, hub moves)."""

from __future__ import annotations

import threading
import time
from typing import Any


def until(check: Any, timeout: float = 10.0) -> Any:
    """``check()``'s first true value within ``timeout`` seconds (polled), else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    return check()


def together(nodes: list[Any], call: Any) -> list[Any]:
    """``call(node)`` on every node at once (each waits for the others' parts), the results in order."""
    results: dict[int, Any] = {}
    threads = [threading.Thread(target=lambda i=i, n=n: results.__setitem__(i, call(n))) for i, n in enumerate(nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[i] for i in range(len(nodes))]
