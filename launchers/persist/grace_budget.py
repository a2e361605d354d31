"""Grace budget: will a dying checkpoint fit between SIGTERM and SIGKILL?

A lost dying checkpoint is most often a timer problem, not a bug: the platform (or torchrun,
or Kubernetes) sends SIGKILL before the save is done. After SIGTERM a worker finishes the
step it is in, agrees to stop, writes its shard and waits for the commit, so it needs::

    step time + save time + margin  ≤  grace period

mlaunch checks this before launch with the times declared in job.yaml
(``checkpoint.step_time``, ``checkpoint.save_time``), and while the job runs with the times
the ranks measure (``launchers.elastic`` publishes them in its shared-memory status: step
time, the last save's duration, the staged state's size). It also keeps the timers in the
chain consistent: mlaunch's own SIGKILL at the grace period, a torchrun
``--shutdown-timeout`` no longer than it, and a Kubernetes ``terminationGracePeriodSeconds``
long enough for mlaunch to finish after its own SIGKILL (``launchers.config.timers``).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launchers.config.durations import format_duration
from launchers.config.timers import timer_chain
from launchers.findings import Finding

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.plan import LaunchPlan

MARGIN = 2.0  # process exit, interpreter teardown, the commit's fsyncs
ASSUMED_BANDWIDTH = 200e6  # bytes/s, only to estimate a save nobody measured or declared


@dataclass
class Budget:
    step_time: float
    save_time: float
    grace: float

    @property
    def needed(self) -> float:
        return self.step_time + self.save_time + MARGIN

    @property
    def fits(self) -> bool:
        return self.needed <= self.grace

    def explain(self, how: str) -> str:
        verdict = "fits in" if self.fits else "does NOT fit in"
        return (
            f"grace budget ({how}): step {format_duration(round(self.step_time, 3))} + save "
            f"{format_duration(round(self.save_time, 3))} + margin {format_duration(MARGIN)} = "
            f"{format_duration(round(self.needed, 3))}, which {verdict} the grace period of "
            f"{format_duration(self.grace)}"
        )


def advice(budget: Budget) -> str:
    return (
        f"a dying checkpoint would be cut off by SIGKILL; raise checkpoint.grace_period to at least "
        f"{format_duration(math.ceil(budget.needed))} (and the platform's own timer with it), or save less"
    )


def declared(job: Job) -> Budget | None:
    cp = job.checkpoint
    if cp.step_time is None and cp.save_time is None:
        return None
    return Budget(cp.step_time or 0.0, cp.save_time or 0.0, cp.grace_period)


def prelaunch_warnings(job: Job) -> list[str]:
    """What mlaunch says before starting anything (declared times only)."""
    budget = declared(job)
    if budget is None or budget.fits:
        return []
    return [f"{budget.explain('declared in job.yaml')}: {advice(budget)}"]


# ----------------------------------------------------------------------------------------
# `mlaunch check`
# ----------------------------------------------------------------------------------------


def _shutdown_timeouts(plan: LaunchPlan) -> list[float]:
    found = []
    for proc in plan.processes:
        for arg in proc.argv:
            if arg.startswith("--shutdown-timeout="):
                try:
                    found.append(float(arg.split("=", 1)[1]))
                except ValueError:
                    continue
        value = proc.env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
        if value:
            try:
                found.append(float(value))
            except ValueError:
                continue
    return found


def _preload_missing(job: Job) -> list[str]:
    """Modules in ``preload:`` this interpreter cannot find (only when the job uses this interpreter)."""
    if job.python and job.python != sys.executable:
        return []
    missing = []
    for name in job.preload:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def check(job: Job, plan: LaunchPlan) -> list[Finding]:
    """The grace-budget entry of ``mlaunch check``."""
    found: list[Finding] = []
    grace = job.checkpoint.grace_period
    budget = declared(job)
    if budget is None:
        found.append(
            Finding(
                "note",
                f"grace period {format_duration(grace)}; declare checkpoint.step_time and save_time to check the "
                "budget before launch (mlaunch also measures them while the job runs)",
            )
        )
    elif budget.fits:
        found.append(Finding("ok", budget.explain("declared")))
    else:
        found.append(Finding("warning", f"{budget.explain('declared')}: {advice(budget)}"))
    for timeout in _shutdown_timeouts(plan):
        if timeout > grace:
            found.append(
                Finding(
                    "warning",
                    f"torchrun's shutdown timeout {format_duration(timeout)} is longer than the grace period "
                    f"{format_duration(grace)}: mlaunch would SIGKILL torchrun before torchrun lets its workers save",
                )
            )
    chain = timer_chain(job)
    found.append(
        Finding(
            "note",
            f"kill timers: mlaunch SIGKILLs {format_duration(grace)} after SIGTERM; a platform's own timer "
            f"(Kubernetes terminationGracePeriodSeconds) should be ≥ {chain.termination_grace_period_seconds}s",
        )
    )
    missing = _preload_missing(job)
    if missing:
        found.append(
            Finding(
                "warning",
                f"preload: {', '.join(missing)} cannot be imported here; warm standbys would fail and restarts "
                "would start cold",
            )
        )
    return found


# ----------------------------------------------------------------------------------------
# While the job runs: the ranks' measurements
# ----------------------------------------------------------------------------------------


class Monitor:
    """Reads the ranks' published step/save times and warns once when the budget does not fit.

    Called from the supervisor loop (about twice a second); cheap: one small read per rank.
    """

    def __init__(self, run_id: str, grace: float, say: Callable[[str], None], *, declared_save: float | None = None):
        self.run_id = run_id
        self.grace = grace
        self.say = say
        self.declared_save = declared_save
        self.warned = False
        self.last: Budget | None = None

    def measure(self) -> Budget | None:
        from launchers.elastic.ipc import staging

        infos = staging.read_run(self.run_id)
        if not infos:
            return None
        step_time = max(i.status.step_time for i in infos)
        if step_time <= 0:
            return None
        measured_saves = [i.status.save_seconds for i in infos if i.status.save_seconds > 0]
        state_bytes = max((i.status.state_bytes for i in infos), default=0)
        if measured_saves:
            save_time, how = max(measured_saves), "measured"
        elif self.declared_save is not None:
            save_time, how = self.declared_save, "declared save"
        elif state_bytes:
            save_time, how = state_bytes / ASSUMED_BANDWIDTH, f"save estimated at {ASSUMED_BANDWIDTH / 1e6:.0f} MB/s"
        else:
            return None
        self.last = Budget(step_time, save_time, self.grace)
        self._how = how
        return self.last

    def __call__(self) -> None:
        if self.warned:
            return
        budget = self.measure()
        if budget is not None and not budget.fits:
            self.warned = True
            self.say(f"warning: {budget.explain('measured step, ' + self._how)}: {advice(budget)}")
