"""What ended an attempt, as a class a person (and a Prometheus label) can read: one rule for the timeline and metrics.

events.jsonl says how each attempt ended (``failure``, ``hang``, ``regroup``, ``stop``, ``membership``);
the timeline colours each fault by its class and ``mlaunch_restarts_total`` counts restarts by it,
so both must classify alike: ``fault_class`` is the one rule.
"""

from __future__ import annotations

import re
import signal as _signal
from typing import Any

# class → what the legend says
CLASSES: dict[str, str] = {
    "sigkill": "killed (SIGKILL, e.g. kill -9, OOM)",
    "signal": "killed by another signal",
    "exit": "exited non-zero",
    "hang": "hang (no progress)",
    "node_lost": "node lost (its mlaunch went silent)",
    "node_left": "node left (membership shrank)",
    "node_joined": "node joined (membership grew)",
    "stop": "stopped (SIGTERM / Ctrl-C to mlaunch)",
}
_LOST = re.compile(r"lost|sent nothing|went silent|silent for", re.IGNORECASE)
_WHO = re.compile(r"node (\d+) rank (\d+)")


def fault_class(event: dict[str, Any]) -> str | None:
    """The class of an attempt-ending event, None for an event that ends nothing."""
    kind = event.get("event")
    if kind == "hang":
        return "hang"
    if kind == "stop":
        return "stop"
    if kind == "membership":
        return "node_left" if event.get("left") else "node_joined" if event.get("joined") else None
    if kind != "failure":
        return None
    cause = str(event.get("cause") or "")
    if cause.startswith("hung"):
        return "hang"
    if _LOST.search(cause):
        return "node_lost"
    sig = event.get("signal")
    if sig == _signal.SIGKILL:
        return "sigkill"
    if isinstance(sig, int):
        return "signal"
    return "exit"


def restart_cause(ends: list[dict[str, Any]]) -> str | None:
    """The cause of one restart from the events that ended the attempt before it (in order; pure).

    A node that left explains everything before it (its loss fails the survivors' collectives:
    their ranks exit before the silence is declared); otherwise the first fault counts (a kill
    whose restart also admits a joining node is still a kill); a re-form alone is ``membership``.
    """
    classes = [fault_class(e) if e.get("event") != "regroup" else "membership" for e in ends]
    classes = [c for c in classes if c is not None and c != "stop"]
    if "node_left" in classes:
        return "node_left"
    first = next((c for c in classes if c not in ("membership", "node_joined")), None)
    return first or ("node_joined" if "node_joined" in classes else "membership" if classes else None)


def where_hit(event: dict[str, Any], rank_nodes: dict[int, int]) -> tuple[int | None, int | None]:
    """(node, rank) an event names: its ``label`` (``node 1 rank 3``), else its rank through ``rank_nodes``."""
    rank = event.get("rank") if isinstance(event.get("rank"), int) else None
    found = _WHO.search(str(event.get("label") or ""))
    if found:
        return int(found.group(1)), int(found.group(2))
    node = event.get("node") if isinstance(event.get("node"), int) else None
    if rank is not None and rank in rank_nodes:
        node = rank_nodes[rank]
    return node, rank


def describe(event: dict[str, Any]) -> str:
    """One line for a hover or a legend: the event's class and its own words."""
    cls = fault_class(event)
    head = CLASSES.get(cls or "", str(event.get("event")))
    detail = event.get("cause") or event.get("label") or ""
    return f"{head}: {detail}" if detail else head
