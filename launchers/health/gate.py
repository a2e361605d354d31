"""What a health check's verdicts mean for training on this node: start, fail, or leave this node out.

``on_failure``:
- ``fail``: any straggler or faulty node → no training starts; every node exits
  ``HEALTH_EXIT_CODE`` (75) naming the bad hosts;
- ``exclude``: when the job declares an elastic node range (``pytorch.nnodes: "3:4"``, or the
  platform's) whose minimum the good nodes still reach, the bad nodes exit 75 and the others
  start without them (torchrun's elastic rendezvous forms the smaller group); else as ``fail``;
- ``warn``: print the bad hosts, start anyway.
A node that could not learn every node's result (one never reported) fails unless ``warn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from launchers.health.check import HEALTH_EXIT_CODE, HealthOutcome, run_health
from launchers.log import say
from launchers.phases import long_phase

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.control import JobEvents
    from launchers.platform.cluster import Cluster


def before_start(
    job: Job, cluster: Cluster, events: JobEvents, on_outcome: Callable[[HealthOutcome], None] | None = None
) -> int | None:
    """The runner's hook before the first attempt and each restart: None to start training, else the exit code.

    ``on_outcome`` sees the verdicts first (the runner logs them to events.jsonl).
    """
    if not job.health_check.before_start:
        return None
    with long_phase("health check"):
        outcome = run_health(job, cluster, events)
    if on_outcome is not None:
        on_outcome(outcome)
    return decide(job, cluster, outcome)


def elastic_minimum(job: Job, cluster: Cluster) -> int | None:
    """The lower end of the job's elastic node range ("3:4" → 3), None without a range."""
    spec = job.pytorch.nnodes or cluster.nnodes_spec
    if not spec or ":" not in spec:
        return None
    low = spec.split(":", 1)[0].strip()
    return int(low) if low.isascii() and low.isdigit() else None


def decide(job: Job, cluster: Cluster, outcome: HealthOutcome) -> int | None:
    mode = job.health_check.on_failure
    if outcome.incomplete is not None and not outcome.bad:
        if mode == "warn":
            say(f"warning: health check incomplete ({outcome.incomplete}); starting anyway")
            return None
        say(f"health check incomplete: {outcome.incomplete}; no training starts (exit code {HEALTH_EXIT_CODE})")
        return HEALTH_EXIT_CODE
    bad = outcome.bad
    if not bad:
        say(f"health check: all {outcome.count} node(s) ok")
        return None
    names = ", ".join(f"{v.host} ({v.verdict}: {v.reason})" for v in bad)
    if mode == "warn":
        say(f"warning: health check found {len(bad)} bad node(s): {names}; starting anyway (on_failure: warn)")
        return None
    if mode == "exclude":
        code = _exclude(job, cluster, outcome)
        if code != -1:
            return code
    say(
        f"health check failed: {len(bad)} bad node(s): {names}; no training starts "
        f"(health_check.on_failure: {mode}; exit code {HEALTH_EXIT_CODE})"
    )
    return HEALTH_EXIT_CODE


def _exclude(job: Job, cluster: Cluster, outcome: HealthOutcome) -> int | None:
    """Leave the bad nodes out when the elastic range allows it; -1 when it does not (then fail)."""
    bad = outcome.bad
    minimum = elastic_minimum(job, cluster)
    good = outcome.count - len(bad) - outcome.unlisted_bad
    if minimum is None or cluster.simulated:
        why = "a simulation cannot leave nodes out" if cluster.simulated else "the job has no elastic node range"
        say(f"health check: cannot exclude ({why}; set pytorch.nnodes such as '{max(good, 1)}:{cluster.nnodes}')")
        return -1
    if good < minimum:
        say(f"health check: cannot exclude: {good} good node(s) is below the elastic minimum {minimum}")
        return -1
    hosts = ", ".join(v.host for v in bad)
    if any(v.index == cluster.node_rank for v in bad):
        say(f"health check: this node is excluded ({hosts}); exit code {HEALTH_EXIT_CODE}")
        return HEALTH_EXIT_CODE
    say(f"health check: starting without {hosts} ({good} node(s), elastic minimum {minimum})")
    return None
