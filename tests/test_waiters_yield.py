"""A hang declared by two nodes at once: the node whose ranks only waited records the culprit's node's failure.

A node of a multi-node job whose hung ranks all wait in a collective leaves the declaration to the
culprit's node for ``WAITER_DEFER`` seconds, then declares it itself. On a loaded machine the culprit's
node can be slower than that (CI r76: node 1 named its waiting rank 3 while node 0 named the sleeping
rank 0 first), so both declare and the hub keeps the first. Each node's events, status and retry policy
must then name the job's first failure, the rank outside its collective. Real control plane: two agents
and the hub on loopback, in this process.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_control_plane import agents, both_joined

from launchers.outcome import Failure, Outcome
from launchers.run.job_wide import job_failure, only_waited

zmq = pytest.importorskip("zmq")

SLEEPER = "hung: no progress for 2s (monitor.hang_timeout) on host h0, last step 6, in hang_rounds.py:30 in <module>"
WAITER = "hung: no progress for 4s (monitor.hang_timeout) on host h1, last step 6, in a collective"


def sleeper_on_node_0() -> Failure:
    return Failure("rank 0", 0, 11, 137, None, [], None, cause=SLEEPER, details={"outside_collective": [0]})


def waiters_on_node_1() -> Failure:
    details = {"outside_collective": [], "in_collective": [3, 2]}
    return Failure("rank 3", 3, 13, 137, None, [], None, cause=WAITER, details=details)


def first_heard(events: Any, attempt: int) -> None:
    deadline = time.monotonic() + 15  # a loaded CI machine: seconds
    while events.first_failure(attempt) is None and time.monotonic() < deadline:
        events.poll()
        time.sleep(0.01)


def test_only_waited_is_a_hang_whose_ranks_all_waited_in_a_collective() -> None:
    assert only_waited(waiters_on_node_1())
    assert not only_waited(sleeper_on_node_0())  # a rank outside any collective: the culprit is here
    stuck = waiters_on_node_1()
    stuck.details["stuck"] = {"2": "in state D (disk sleep)"}
    assert not only_waited(stuck)  # a stuck rank is a culprit too
    assert not only_waited(Failure("rank 3", 3, 13, 137, 9, [], None))  # a crash is not a hang
    assert not only_waited(None)


def test_the_waiting_node_records_the_sleepers_node_when_that_was_declared_first() -> None:
    a, b = agents()
    try:
        both_joined(a, b)
        a.report_failure(sleeper_on_node_0())  # node 0 declares first ...
        first_heard(b, 0)
        b.report_failure(waiters_on_node_1())  # ... node 1's defer ran out a moment later: it declares too
        recorded = job_failure(b, 0, Outcome("failed", 137, waiters_on_node_1()))
        assert recorded.failure is not None
        assert (recorded.failure.rank, recorded.failure.label) == (0, "node 0 rank 0"), recorded.failure
        assert recorded.failure.cause == SLEEPER and "outside_collective" not in recorded.failure.details
        assert recorded.exit_code == 137 and recorded.status == "failed"
        own = job_failure(a, 0, Outcome("failed", 137, sleeper_on_node_0()))  # the culprit's node keeps its own
        assert own.failure is not None and own.failure.details == {"outside_collective": [0]}
    finally:
        b.close(0)
        a.close(0)


def test_the_waiting_node_keeps_its_own_hang_when_nobody_else_declared_first() -> None:
    """The culprit's node never said so (its mlaunch stalled): the waiters' node's declaration is the job's."""
    a, b = agents()
    try:
        both_joined(a, b)
        b.report_failure(waiters_on_node_1())
        first_heard(a, 0)
        a.report_failure(sleeper_on_node_0())  # late: the hub keeps node 1's
        recorded = job_failure(b, 0, Outcome("failed", 137, waiters_on_node_1()))
        assert recorded.failure is not None and recorded.failure.rank == 3
        assert recorded.failure.details["in_collective"] == [3, 2]
    finally:
        b.close(0)
        a.close(0)
