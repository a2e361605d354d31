"""FAKE worker API (init_taskd_worker(rank_id, upper_limit_of_disk_in_mb=5000, framework="pt"))."""

from __future__ import annotations

from taskd._record import record

_rank: int | None = None


def init_taskd_worker(rank_id: int, upper_limit_of_disk_in_mb: int = 5000, framework: str = "pt") -> bool:
    global _rank
    ok = isinstance(rank_id, int) and rank_id >= 0
    record("init_taskd_worker", rank_id=rank_id, disk_mb=upper_limit_of_disk_in_mb, framework=framework, ok=ok)
    _rank = rank_id if ok else None
    return ok


def start_taskd_worker() -> bool:
    record("start_taskd_worker", rank_id=_rank)
    return _rank is not None


def destroy_taskd_worker() -> bool:
    record("destroy_taskd_worker", rank_id=_rank)
    return True
