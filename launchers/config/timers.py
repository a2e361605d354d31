"""The kill timers of the chain, all from job.yaml: the one place that computes them.

After a stop request a worker has ``checkpoint.grace_period`` to write its dying checkpoint;
every timer that can SIGKILL it must agree with that:

- mlaunch SIGKILLs the workers ``grace_period`` after forwarding SIGTERM;
- torchrun (``pytorch.style: torchrun``) gets ``--shutdown-timeout`` = the grace period in
  whole seconds, never longer than mlaunch's, or mlaunch would kill torchrun first;
- a Kubernetes pod gets ``terminationGracePeriodSeconds`` = grace period +
  ``kubernetes.termination_margin`` (15 s by default), rounded up, so the kubelet's SIGKILL
  comes only after mlaunch's own and its teardown.

Pure arithmetic over the job: the manifests, the engines and ``mlaunch check`` all read it here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchers.config.job import Job


@dataclass(frozen=True)
class KillTimers:
    mlaunch_grace: float  # seconds from SIGTERM to mlaunch's SIGKILL of the workers
    torchrun_shutdown_timeout: int  # torchrun's --shutdown-timeout
    termination_grace_period_seconds: int  # a Kubernetes pod's terminationGracePeriodSeconds


def timer_chain(job: Job) -> KillTimers:
    """Every kill timer of the chain, consistent with job.yaml's grace period."""
    grace = job.checkpoint.grace_period
    return KillTimers(
        mlaunch_grace=grace,
        torchrun_shutdown_timeout=int(grace),
        termination_grace_period_seconds=math.ceil(grace + job.kubernetes.termination_margin),
    )
