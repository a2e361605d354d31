"""The verdict rules: from every node's measurements to ok / straggler / faulty, the same on every node.

Pure (no I/O): each node computes it from the same gathered results, so every node knows
the bad hosts without another round trip, and the rules are unit-tested directly.

- **faulty**: no result (the node was lost or too slow to report), a probe error, the
  checkpoint directory not writable or with less than ``min_free_gb`` free, a device with
  ``memory_limit`` or more of its memory in use, or no working link to any node;
- **straggler**: seconds per matmul > ``factor`` × the median of all nodes, or the node's
  *best* link slower than ``factor`` × the median of every node's best link (and by more
  than ``LINK_SLACK`` seconds, so a few milliseconds of scheduling noise on a fast network
  is not a fault). Using each node's best link localises a bad NIC: its every link is slow,
  every other node has at least one fast link. The median is the lower median, so with 4
  nodes two bad ones cannot drag the reference up to their own speed.
- With 2 nodes one link cannot say which end is slow: a failed link makes both faulty.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LINK_SLACK = 0.005  # seconds a best link may exceed factor × median before it counts (scheduling noise)
GIB = 1 << 30


@dataclass(frozen=True)
class Rules:
    factor: float = 2.0
    memory_limit: float = 0.3
    min_free_gb: float = 1.0


@dataclass
class Verdict:
    index: int
    host: str
    verdict: str  # "ok" | "straggler" | "faulty"
    reason: str
    result: dict[str, Any] | None

    @property
    def bad(self) -> bool:
        return self.verdict != "ok"


def judge(
    results: Mapping[int, dict[str, Any] | None], nnodes: int, rules: Rules, hosts: dict[int, str]
) -> list[Verdict]:
    """One verdict per node index 0..nnodes-1 (a missing or None result is faulty)."""
    faulty: dict[int, list[str]] = {i: [] for i in range(nnodes)}
    slow: dict[int, list[str]] = {i: [] for i in range(nnodes)}
    present = {i: r for i, r in results.items() if r is not None and 0 <= i < nnodes}
    for index in range(nnodes):
        if index not in present:
            faulty[index].append("no health result (lost, unreachable or too slow to report)")
        else:
            faulty[index].extend(local_faults(present[index], rules))
    _compute_stragglers(present, rules.factor, slow)
    _link_verdicts(present, rules.factor, faulty, slow)
    verdicts = []
    for index in range(nnodes):
        result = present.get(index)
        host = str((result or {}).get("host") or hosts.get(index, f"node-{index}"))
        if faulty[index]:
            verdicts.append(Verdict(index, host, "faulty", "; ".join(faulty[index] + slow[index]), result))
        elif slow[index]:
            verdicts.append(Verdict(index, host, "straggler", "; ".join(slow[index]), result))
        else:
            verdicts.append(Verdict(index, host, "ok", "", result))
    return verdicts


def local_faults(result: dict[str, Any], rules: Rules) -> list[str]:
    """What a node's own probes make faulty: errors, device memory in use, the checkpoint directory."""
    reasons = []
    for probe in ("compute", "memory", "storage"):
        error = (result.get(probe) or {}).get("error")
        if error:
            reasons.append(str(error))
    for device in (result.get("memory") or {}).get("devices", []):
        used = float(device.get("used_fraction", 0.0))
        if used >= rules.memory_limit:
            reasons.append(
                f"device {device.get('index')} has {used:.0%} of its memory in use (limit {rules.memory_limit:.0%})"
            )
    storage = result.get("storage") or {}
    free = storage.get("free_bytes")
    if storage.get("writable") and isinstance(free, int) and free < rules.min_free_gb * GIB:
        reasons.append(f"checkpoint directory has {free / GIB:.2f} GiB free (need {rules.min_free_gb:g})")
    return reasons


def _compute_stragglers(present: dict[int, dict[str, Any]], factor: float, slow: dict[int, list[str]]) -> None:
    times = {
        i: r["compute"]["seconds_per_op"] for i, r in present.items() if "seconds_per_op" in (r.get("compute") or {})
    }
    if len(times) < 2:
        return
    median = statistics.median_low(times.values())
    for index, seconds in times.items():
        if seconds > factor * median:
            slow[index].append(
                f"compute {seconds / median:.1f}× the median ({seconds * 1e3:.2f} vs {median * 1e3:.2f} ms/matmul)"
            )


def best_links(present: dict[int, dict[str, Any]]) -> dict[int, float]:
    """Each node's fastest link in seconds (inf: every link failed); nodes that tested no link are left out."""
    best = {}
    for index, result in present.items():
        links = result.get("links") or {}
        if links:
            best[index] = min((float(t) for t in links.values() if t is not None), default=float("inf"))
    return best


def _link_verdicts(
    present: dict[int, dict[str, Any]], factor: float, faulty: dict[int, list[str]], slow: dict[int, list[str]]
) -> None:
    best = best_links(present)
    if not best:
        return
    working = [t for t in best.values() if t != float("inf")]
    if len(best) == 2 or not working:
        for index, seconds in best.items():
            if seconds == float("inf"):
                faulty[index].append(
                    "no working link (with 2 nodes the bad end cannot be told)" if len(best) == 2 else "no working link"
                )
        return
    median = statistics.median_low(working)
    for index, seconds in best.items():
        if seconds == float("inf"):
            faulty[index].append("no link to any node works")
        elif seconds > factor * median and seconds - median > LINK_SLACK:
            slow[index].append(f"every link slow: best {seconds * 1e3:.1f} ms vs median {median * 1e3:.1f} ms")
