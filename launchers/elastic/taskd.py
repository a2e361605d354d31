"""TaskD worker side, for training scripts: one call once the global rank is known.

MindCluster's guide has MindSpeed users edit ``training.py`` to call
``init_taskd_worker(rank, 5000, "pt")`` and ``start_taskd_worker()`` after
``torch.distributed`` is initialised. With mlaunch the script calls::

    from launchers.elastic import taskd
    taskd.start_worker(torch.distributed.get_rank())   # no-op (False) when the job does not use TaskD

It does nothing unless mlaunch started the job with ``high_availability.taskd`` on
(``MLAUNCH_TASKD=1`` in the process env), so the same script runs with and without TaskD.
When TaskD is on and cannot start, it raises: a job that asked for fault recovery should
not silently run without it.
"""

from __future__ import annotations

import os

__all__ = ["enabled", "start_worker", "stop_worker"]

ENV_FLAG = "MLAUNCH_TASKD"


def enabled() -> bool:
    """Whether mlaunch wired TaskD into this job."""
    return os.environ.get(ENV_FLAG) == "1"


def _rank_from_env() -> int:
    for name in ("RANK", "RANK_ID"):
        value = os.environ.get(name, "").strip()
        if value.isascii() and value.isdigit():
            return int(value)
    raise RuntimeError("start_worker(rank) needs the global rank: pass it, or run under mlaunch (RANK is set)")


def start_worker(rank: int | None = None, *, disk_limit_mb: int = 5000, framework: str = "pt") -> bool:
    """Init and start this process's TaskD worker; False when the job does not use TaskD.

    ``rank`` is the global rank (default ``$RANK``); ``disk_limit_mb`` and ``framework``
    (``"pt"`` PyTorch, ``"ms"`` MindSpore) are passed to ``init_taskd_worker``.
    """
    if not enabled():
        return False
    if rank is None:
        rank = _rank_from_env()
    if rank < 0:
        raise ValueError(f"rank must be ≥ 0, got {rank}")
    try:
        from taskd.api import init_taskd_worker, start_taskd_worker
    except ImportError as exc:
        raise RuntimeError(f"TaskD is enabled for this job but taskd.api cannot be imported: {exc}") from exc
    if not init_taskd_worker(rank, disk_limit_mb, framework):
        raise RuntimeError(f"init_taskd_worker({rank}, {disk_limit_mb}, {framework!r}) failed")
    if not start_taskd_worker():
        raise RuntimeError("start_taskd_worker() failed")
    return True


def stop_worker() -> bool:
    """Destroy this process's TaskD worker (at the end of training); False when TaskD is off."""
    if not enabled():
        return False
    from taskd.api import destroy_taskd_worker

    return bool(destroy_taskd_worker())
