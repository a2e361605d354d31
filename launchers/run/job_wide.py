"""The runner's side of the control plane: who failed first, a lost node, meeting before a restart.

Every node runs the same attempts: a failure anywhere ends the attempt on every node (the
supervisor's ``job_events``), each node asks the hub which failure was the job's first (its
exit code is the job's), and before attempt g+1 every node meets the others (``topics.restart``),
so restarts are counted job-wide and a node that is gone ends the job instead of a restart.
"""

from __future__ import annotations

import dataclasses
import time

from launchers.control import ExchangeFailed, JobEvents, Reduction, topics
from launchers.log import say
from launchers.outcome import Failure, Outcome, remote_failure

FIRST_FAILURE_WAIT = 2.0  # seconds to wait for the hub's word on who failed first


def job_exit_code(events: JobEvents, attempt: int, outcome: Outcome) -> tuple[int, bool]:
    """The job's exit code after failed ``attempt``, and whether the job ends now (a lost node, node 0 ended it)."""
    first = events.first_failure(attempt, FIRST_FAILURE_WAIT if events.networked else 0.0)
    code = outcome.exit_code
    if first is not None:
        code = first.exit_code or 1
        if events.networked:
            say(f"first failure in the job (generation {attempt}): {first.describe()}")
    lost = events.lost
    if lost is not None:
        say(f"job failed: {lost.describe()}; not restarting; exit code {code or 1}")
        return code or 1, True
    ended = events.ended
    if ended is not None:  # node 0 ended the job: nobody is left to restart with
        say(f"{ended.describe()}; not restarting; exit code {ended.exit_code or code or 1}")
        return ended.exit_code or code or 1, True
    return code, False


def only_waited(failure: Failure | None) -> bool:
    """A hang this node declared although every hung rank here waited in a collective for another rank.

    Such a node leaves the declaration to the culprit's node for ``hang.WAITER_DEFER`` seconds, then
    declares it itself, so that a culprit's node that cannot say so still ends the attempt. When
    both declare (the culprit's node was slow, a loaded machine), the hub keeps the first.
    """
    if failure is None or not failure.cause.startswith("hung"):
        return False
    details = failure.details
    return bool(details.get("in_collective")) and not details.get("outside_collective") and not details.get("stuck")


def job_failure(events: JobEvents, attempt: int, outcome: Outcome) -> Outcome:
    """``outcome`` as this node records it: a hang declared here by ranks that only waited yields to the job's
    first failure when that is another node's, so every node's events, status and retry policy name the culprit
    (the rank outside its collective), not the rank that waited for it."""
    if outcome.status != "failed" or not events.networked or not only_waited(outcome.failure):
        return outcome
    first = events.first_failure(attempt, FIRST_FAILURE_WAIT)
    if first is None or first.node == events.node:
        return outcome
    assert outcome.failure is not None
    say(f"{first.node_label} was declared hung first; this node's hung ranks only waited for it "
        f"({outcome.failure.label} here): the attempt's failure is {first.node_label}")  # fmt: skip
    return dataclasses.replace(outcome, failure=remote_failure(first))


def meet_before_restart(events: JobEvents, attempt: int, timeout: float) -> bool:
    """Every node is ready for ``attempt`` (True), or one is lost or late (False, said why)."""
    if not events.networked:
        return True
    try:
        events.reduce(topics.restart(attempt), None, time.monotonic() + timeout, Reduction.COUNT)
    except ExchangeFailed as exc:
        say(f"job failed: cannot restart together: {exc}")
        return False
    return True
