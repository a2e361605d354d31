"""``control_scale``'s steady state: what every node publishes each second, and what it costs node 0's hub.

Every node's observer publishes an 8-rank status entry every second (``node_entry``,
``publish_for``); node 0 does too, and its summary every 10 steps, while ``steady`` reads the
hub's CPU (its process and its thread) and the bytes through its socket over the second half.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def node_entry(node: int, step: int) -> dict[str, Any]:
    """What the observer publishes for a node of 8 ranks (``observe.status_file``'s shape)."""
    now = time.time()
    ranks = [
        {
            "rank": node * 8 + i,
            "step": step,
            "steps_per_s": 1.234,
            "step_time_s": 0.8103,
            "own_step_time_s": 0.7921,
            "last_progress": round(now, 3),
            "last_progress_age_s": 0.4,
            "committed_step": step - step % 100,
            "straggler": False,
            "hung": False,
        }
        for i in range(8)
    ]
    return {"index": node, "host": f"node-{node:05d}.cluster.local", "ranks": ranks}


def publish_for(agents: list[Any], seconds: float) -> None:
    """What every node's observer does: its status entry every second."""
    end = time.monotonic() + seconds
    step = 100
    while time.monotonic() < end:
        tick = time.monotonic()
        step += 1
        for events in agents:
            events.publish(node_entry(events.node, step))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))


def steady(events: Any, seconds: float) -> dict[str, float]:
    """Node 0 publishes too; the hub's CPU and traffic over the second half of ``seconds``."""
    hub = events.hub
    warm = seconds / 2
    end = time.monotonic() + seconds
    mark: tuple[float, float, Any] | None = None
    step = 100
    while time.monotonic() < end:
        tick = time.monotonic()
        step += 1
        events.publish(node_entry(0, step))
        if step % 10 == 0:
            events.publish_summary({"phase": "running", "last_committed_step": step - step % 10, "stragglers": []})
        if mark is None and tick >= end - seconds + warm:
            mark = (time.monotonic(), time.process_time(), _copy(hub.traffic))
            hub_cpu = thread_cpu(hub.native_id)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    assert mark is not None
    wall = time.monotonic() - mark[0]
    cpu = time.process_time() - mark[1]
    now, before = hub.traffic, mark[2]
    return {
        "cpu": cpu / wall,
        "hub_thread": (thread_cpu(hub.native_id) - hub_cpu) / wall,
        "bytes_in": (now.bytes_in - before.bytes_in) / wall,
        "bytes_out": (now.bytes_out - before.bytes_out) / wall,
        "messages_in": (now.messages_in - before.messages_in) / wall,
        "slowest_broadcast": now.slowest_broadcast,
        "status_every": hub.cadence.status,
        "handshakes": hub.strangers.authenticated,  # CURVE handshakes completed (the join is mostly these)
        "handshakes_failed": hub.strangers.handshake_failed,  # cut (past the deadline) and done again
    }


def thread_cpu(tid: int | None) -> float:
    """CPU seconds of one thread of this process (/proc: utime + stime)."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _copy(traffic: Any) -> Any:
    from dataclasses import replace

    return replace(traffic)
