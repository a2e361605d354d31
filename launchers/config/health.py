"""``health_check:`` — the node health check before training (compute, device memory, storage, links)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from launchers.config.fields import Duration, Section


class HealthCheckOptions(Section):
    """``health_check:`` — measure every node before the first attempt and refuse (or leave out) bad ones.

    Why before training: a slow NIC or a starved CPU makes every rank wait for it at each
    step, and a full device or an unwritable checkpoint directory fails the job minutes in.
    ``mlaunch health job.yaml`` runs the same check on its own.
    """

    before_start: bool = Field(False, description="run the check before the first attempt of `mlaunch run`")
    on_failure: Literal["fail", "exclude", "warn"] = Field(
        "fail",
        description="a straggler or faulty node: fail (nothing trains, every node exits 75 naming the bad hosts), "
        "exclude (start without them when pytorch.nnodes is an elastic range such as '3:4' that still holds, "
        "else fail), warn (print and start anyway)",
    )
    straggler_factor: float = Field(
        2.0,
        gt=1.0,
        le=100.0,
        description="slower than this × the median (compute, or the best link) is a straggler",
    )
    memory_limit: float = Field(
        0.3, gt=0.0, le=1.0, description="a device (GPU/NPU) with this fraction of its memory already in use is faulty"
    )
    min_free_gb: float = Field(1.0, ge=0.0, description="a checkpoint directory with less free space (GiB) is faulty")
    timeout: Duration = Field(
        60.0,
        description="how long the nodes wait for each other to arrive (start mlaunch, import torch); a node not "
        "there by then is faulty. The measuring itself adds about 3 s plus up to 5 s per link round",
    )
