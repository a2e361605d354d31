"""What node 0 shows of a health check: one table on stderr and ``<log_dir>/health.json``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from launchers.atomic import write_atomic
from launchers.health.verdict import Verdict


def _compute(result: dict[str, Any]) -> str:
    compute = result.get("compute") or {}
    if "seconds_per_op" not in compute:
        return "error"
    return f"{compute['seconds_per_op'] * 1e3:.2f} ms ({compute['gflops']:.0f} GF/s)"


def _memory(result: dict[str, Any]) -> str:
    memory = result.get("memory") or {}
    if memory.get("error"):
        return "error"
    devices = memory.get("devices") or []
    if not devices:
        return "no device"
    return f"{max(float(d['used_fraction']) for d in devices):.0%} used"


def _storage(result: dict[str, Any]) -> str:
    storage = result.get("storage") or {}
    if not storage.get("writable"):
        return "NOT writable"
    return f"{storage.get('free_bytes', 0) / (1 << 30):.0f} GiB, {storage.get('write_mb_s', 0):.0f} MB/s"


def _link(result: dict[str, Any]) -> str:
    links = [t for t in (result.get("links") or {}).values()]
    if not links:
        return "-"
    working = [float(t) for t in links if t is not None]
    if not working:
        return "all failed"
    failed = len(links) - len(working)
    return f"best {min(working) * 1e3:.1f} ms" + (f", {failed} failed" if failed else "")


def rows(verdicts: list[Verdict]) -> list[list[str]]:
    table = [["node", "host", "compute", "memory", "storage", "link", "verdict"]]
    for v in verdicts:
        r = v.result or {}
        cells = [_compute(r), _memory(r), _storage(r), _link(r)] if v.result else ["-"] * 4
        verdict = v.verdict + (f": {v.reason}" if v.reason else "")
        table.append([str(v.index), v.host, *cells, verdict])
    return table


def table(verdicts: list[Verdict]) -> str:
    """A plain fixed-width table (it goes to logs as often as to terminals)."""
    grid = rows(verdicts)
    widths = [max(len(row[col]) for row in grid) for col in range(len(grid[0]) - 1)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1] for row in grid
    ]
    return "\n".join(line.rstrip() for line in lines)


def document(verdicts: list[Verdict], seconds: float, factor: float) -> dict[str, Any]:
    nodes = []
    for v in verdicts:
        entry: dict[str, Any] = {"index": v.index, "host": v.host, "verdict": v.verdict, "reason": v.reason}
        if v.result:
            entry.update({k: v.result.get(k) for k in ("compute", "memory", "storage", "phases")})
            entry["links"] = {
                str(peer): t for peer, t in sorted((v.result.get("links") or {}).items(), key=lambda kv: int(kv[0]))
            }
        nodes.append(entry)
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(seconds, 3),
        "straggler_factor": factor,
        "bad_hosts": [v.host for v in verdicts if v.bad],
        "nodes": nodes,
    }


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=2) + "\n")
