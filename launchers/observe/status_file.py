"""``<log_dir>/status.json``: the job as every node's mlaunch last saw it — what ``mlaunch status`` shows.

Each node's mlaunch builds its own entry (its ranks, sampled twice a second) and publishes it
on the control plane; node 0's hub keeps every node's entry, so node 0 writes the whole job's
view, and another node writes its own ranks with node 0's summary until ``mlaunch status``
there asks for the whole view (``status_relay``; a simulation writes every node itself).
Replaced atomically (a rename) at most once a second; not fsynced: it is a view, not a
record, and a sync every second would cost a shared file system.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from launchers.observe.steps import RankProgress

STATUS_FILE = "status.json"


def rank_entry(r: RankProgress, *, now: float, straggler: bool, hung: bool) -> dict[str, Any]:
    rate = r.steps_per_s
    return {
        "rank": r.rank,
        "step": r.step if r.step >= 0 else None,
        "steps_per_s": round(rate, 3) if rate is not None else None,
        "step_time_s": round(r.step_time, 4) if r.step_time is not None else None,
        "own_step_time_s": round(r.own_step_time, 4) if r.own_step_time is not None else None,
        "last_progress": round(r.last_wall, 3) if r.last_wall else None,
        "last_progress_age_s": round(now - r.last_wall, 1) if r.last_wall else None,
        "committed_step": r.committed_step if r.committed_step >= 0 else None,
        "started_over_from": r.started_over if r.started_over >= 0 else None,
        "straggler": straggler,
        "hung": hung,
        "in_collective": r.in_collective,  # a hung rank inside a collective waits for one that is not
        "hang_frame": r.frame,
    }


def node_entry(index: int, host: str, ranks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"index": index, "host": host, "ranks": sorted(ranks, key=lambda r: r["rank"]), **extra}


def job_status(
    *, job: str, run_id: str, phase: str, attempt: int, restarts: int, nodes: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    committed = [r["committed_step"] for n in nodes for r in n["ranks"] if r.get("committed_step") is not None]
    return {
        "job": job,
        "run_id": run_id,
        "updated": round(time.time(), 3),
        "phase": phase,
        "attempt": attempt,
        "restarts": restarts,
        "last_committed_step": min(committed) if committed else None,
        "nodes": sorted(nodes, key=lambda n: n["index"]),
        **extra,
    }


def write_status(log_dir: Path, status: dict[str, Any]) -> None:
    target = log_dir / STATUS_FILE
    tmp = log_dir / f".{STATUS_FILE}.{os.getpid()}.tmp"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(status, indent=1), encoding="utf-8")
        os.replace(tmp, target)
    except OSError:  # the status view is best effort: a full disk must not fail the run
        with contextlib.suppress(OSError):
            tmp.unlink()


def read_status(path: Path) -> dict[str, Any]:
    """The newest status (raises OSError / ValueError for the command to explain)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError(f"{path} is not an mlaunch status file (no 'nodes' list)")
    return data
