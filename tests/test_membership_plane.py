"""An elastic job's membership on the real control plane (issue 27): leaving out, voiding, meeting, admitting.

Node 0's hub and real ``NetworkEvents`` agents over loopback TCP (each agent its own DEALER
socket); a node's mlaunch ending is its agent's socket closing with no farewell (what a SIGKILL
leaves), a restarted mlaunch is a new ``NetworkEvents`` for the same node. The netns tests
(tests/test_membership_hosts.py) run the same with real training across hosts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from plane_helpers import together, until

from launchers.control import ExchangeFailed, Left, Lost, Meeting, Regroup
from launchers.platform.cluster import free_port

zmq = pytest.importorskip("zmq")

KEY = b"m" * 32


def agent(node: int, port: int, node_timeout: float, elastic: tuple[int, int] | None, **more: Any) -> Any:
    from launchers.control.agent import NetworkEvents

    return NetworkEvents(
        node=node,
        nnodes=3,
        master_addr="127.0.0.1",
        port=port,
        secret=KEY,
        node_timeout=node_timeout,
        host=f"h{node}",
        elastic=elastic,
        **more,
    )


@contextmanager
def plane(elastic: tuple[int, int] | None, node_timeout: float = 10.0) -> Iterator[tuple[list[Any], int]]:
    port = free_port()
    nodes = [agent(n, port, node_timeout, elastic) for n in range(3)]
    try:
        yield nodes, port
    finally:
        for events in reversed(nodes):
            events.close(0)


def meet(nodes: list[Any], key: str, generation: int) -> list[Meeting]:
    return together(nodes, lambda n: n.meet(key, generation, 0, time.monotonic() + 8))


def count(nodes: list[Any], topic: str) -> list[int]:
    return together(nodes, lambda n: n.reduce(topic, None, time.monotonic() + 8, "count"))


def vanish(events: Any) -> None:
    """The node's mlaunch ends without a farewell (its socket closes, as a SIGKILL leaves it)."""
    events.driver.remove(events.state)


def next_event(events: Any, kind: type) -> Any:
    return until(lambda: next((e for e in iter(events.poll, None) if isinstance(e, kind)), None))


@contextmanager
def came_back(nodes: list[Any], port: int) -> Iterator[Any]:
    """Node 2 vanished, the others met without it, and a new mlaunch there joined: a candidate."""
    meet(nodes, "0", 0)
    vanish(nodes[2])
    next_event(nodes[0], Left)
    meet(nodes[:2], "1", 1)
    back = agent(2, port, 10.0, (2, 3))
    try:
        assert back.joined(time.monotonic() + 5) and back.candidate
        yield back
    finally:
        back.close(0)


def test_a_member_that_vanishes_is_left_out_and_the_others_meet_without_it() -> None:
    """Within the range the job goes on: a ``Left`` event, not ``Lost``; exchanges of the old membership are void."""
    with plane((2, 3)) as (nodes, _port):
        assert [m.members for m in meet(nodes, "0", 0)] == [(0, 1, 2)] * 3
        nodes[0].state.contribute("bg/a0/ok", True, "and")  # an exchange in flight when node 2 goes
        nodes[0].driver.kick()
        began = time.monotonic()
        vanish(nodes[2])
        left = next_event(nodes[1], Left)
        took = time.monotonic() - began
        assert isinstance(left, Left) and left.node == 2 and left.host == "h2", left
        assert "connection to the control plane closed" in left.why  # found by the closed connection ...
        assert took < 10.0  # ... not after node_timeout (10 s)
        assert nodes[0].lost is None and nodes[1].lost is None
        with pytest.raises(ExchangeFailed, match="left the job"):
            nodes[0].state.result("bg/a0/ok", time.monotonic() + 5)  # the answer to the one in flight
        with pytest.raises(ExchangeFailed, match="membership changed"):  # a new exchange of the old membership
            nodes[1].reduce("bg/a0/next", 1, time.monotonic() + 5, "max")
        after = meet(nodes[:2], "1", 1)
        assert [m.members for m in after] == [(0, 1)] * 2
        assert [x.node for x in after[0].left] == [2] and after[0].joined == ()
        assert count(nodes[:2], "start/1") == [2, 2]  # the new membership's exchanges


def test_without_a_range_or_below_the_minimum_a_vanished_member_ends_the_job() -> None:
    for elastic, reason in ((None, ""), ((3, 3), "below the elastic minimum 3")):
        with plane(elastic, node_timeout=1.0) as (nodes, _port):
            assert until(lambda n=nodes: all(x.state.welcomed for x in n))
            vanish(nodes[2])
            lost = until(lambda n=nodes: n[1].lost)
            assert isinstance(lost, Lost) and lost.node == 2, lost
            assert reason in lost.describe(), lost.describe()


def test_a_node_that_comes_back_waits_and_is_admitted_at_the_next_meeting() -> None:
    """A new mlaunch on a node that was left out joins as a candidate: no ranks, admitted by the next meeting."""
    with plane((2, 3)) as (nodes, port), came_back(nodes, port) as back:
        assert back.admission(0.2) is None  # nobody met yet: it keeps waiting
        assert until(lambda: nodes[0].waiting() == [2])
        met = meet(nodes[:2], "2", 2)
        admitted = back.admission(5)
        assert isinstance(admitted, Meeting) and admitted == met[0]
        assert admitted.members == (0, 1, 2) and admitted.joined == ((2, "h2"),) and admitted.generation == 2
        assert not back.candidate and nodes[0].waiting() == []
        assert count([nodes[0], nodes[1], back], "start/3") == [3, 3, 3]  # it counts with the others


def test_a_candidate_is_ready_to_join_only_once_it_says_so_and_not_after_it_is_admitted() -> None:
    """Node 0's grow at a checkpoint re-forms for a candidate whose ranks would start warm (``ready``).

    A candidate still warming its standbys waits without holding the job; its ``ready`` (said
    again while it waits) puts it in ``ready_to_join``; admitted, it is a member and no longer there.
    """
    with plane((2, 3)) as (nodes, port), came_back(nodes, port) as back:
        assert until(lambda: nodes[0].waiting() == [2])
        time.sleep(0.3)
        assert nodes[0].ready_to_join() == []  # still warming: the job is not re-formed for it
        back.ready()
        back.ready()  # said again: no news
        assert until(lambda: nodes[0].ready_to_join() == [2])
        meet(nodes[:2], "2", 2)
        assert isinstance(back.admission(5), Meeting)
        assert until(lambda: nodes[0].waiting() == [] and nodes[0].ready_to_join() == [])


def test_a_restarted_mlaunch_replaces_its_old_self_and_node_0_can_regroup_for_it() -> None:
    """Node 2's mlaunch starts again while its old one is silent: the old one is left out at once, the new
    one waits; node 0's regroup (a checkpoint was committed) reaches every member and the meeting says so."""
    with plane((2, 3)) as (nodes, port):
        meet(nodes, "0", 0)
        nodes[2].driver.remove(nodes[2].state)
        again = agent(2, port, 10.0, (2, 3))
        try:
            left = next_event(nodes[1], Left)
            assert left.node == 2 and "started again" in left.why, left
            assert again.joined(time.monotonic() + 5) and again.candidate
            nodes[0].regroup("node 2 waits to join")
            assert isinstance(next_event(nodes[1], Regroup), Regroup)
            met = meet(nodes[:2], "1", 1)
            assert met[0].regroup == "node 2 waits to join" and met[0].members == (0, 1, 2)
            assert again.admission(5) == met[0]
        finally:
            again.close(0)


def test_a_member_that_finished_while_node_0_regroups_ends_the_job_with_code_0_on_every_node() -> None:
    """The storm's last fault: node 0 regrouped for a waiting node as the job's last step ended; node 1's
    ranks had exited 0 and its mlaunch said bye. Node 0 and node 2 waited at the meeting for it until
    "not every node came to the meeting in time" failed the job; now the meeting ends it with 0."""
    port = free_port()
    nodes = [agent(n, port, 10.0, (2, 3)) for n in range(3)]
    try:
        meet(nodes, "0", 0)
        nodes[0].regroup("node 3 waits to join")
        nodes[1].close(0)  # its ranks finished the training: its mlaunch ends with 0
        for node in (nodes[0], nodes[2]):
            with pytest.raises(ExchangeFailed, match="training finished"):  # before: "... in time", 8 s later
                node.meet("1", 1, 0, time.monotonic() + 8)
            assert node.ended is not None and node.ended.exit_code == 0, node.ended
            assert "node 1's training finished" in node.ended.describe()
    finally:
        for events in (nodes[2], nodes[0]):
            events.close(0)


def test_a_preempted_member_leaves_gracefully_and_a_waiting_candidate_fills_the_minimum() -> None:
    """Issue 34's storm case: members 0 and 2 (MIN 2), node 1 waits; node 2's mlaunch gets SIGTERM.

    It says it is leaving: the others get a graceful ``Left`` at once (their ranks are saving with its
    ranks), nobody waits for it at the meeting, and the meeting admits node 1 — 2 nodes again, not the
    end of the job."""
    with plane((2, 3)) as (nodes, port):
        meet(nodes, "0", 0)
        vanish(nodes[1])  # node 1's mlaunch killed: the job shrinks to 0 and 2
        assert next_event(nodes[0], Left).node == 1
        meet([nodes[0], nodes[2]], "1", 1)
        back = agent(1, port, 10.0, (2, 3))  # node 1 started again: a candidate
        try:
            assert back.joined(time.monotonic() + 5) and back.candidate
            assert until(lambda: nodes[0].waiting() == [1])
            nodes[2].leave("its mlaunch was stopped by SIGTERM (a preemption)")
            left = next_event(nodes[0], Left)
            assert left.node == 2 and left.graceful and "SIGTERM" in left.why, left
            assert nodes[0].ended is None and nodes[0].lost is None
            (met,) = meet([nodes[0]], "2", 2)  # node 0 alone: the leaving node is not waited for
            assert met.members == (0, 1) and met.joined == ((1, "h1"),) and [x.node for x in met.left] == [2]
            assert met.left[0].graceful
            assert back.admission(5) == met
        finally:
            back.close(0)


def test_a_preemption_below_the_minimum_ends_the_job_on_every_node_at_once() -> None:
    """No candidate to fill in: the hub ends the job (exit 143, saying why) instead of a meeting that waits."""
    with plane((3, 3)) as (nodes, _port):
        meet(nodes, "0", 0)
        nodes[2].leave("its mlaunch was stopped by SIGTERM (a preemption)")
        ended = until(lambda: nodes[1].ended)
        assert ended is not None and ended.exit_code == 143, ended
        assert "below the elastic minimum 3" in ended.describe() and "node 2 is leaving" in ended.describe()
        assert until(lambda: nodes[0].ended) is not None
        with pytest.raises(ExchangeFailed, match="exit code 143"):
            nodes[0].meet("1", 1, 0, time.monotonic() + 5)
        # the leaving node learns it too: its dying save's exchange ends at once instead of at its grace period's
        # end (a chaos storm's SIGTERM to every node: node 1's save waited 9.9 s for node 0, which had exited)
        assert until(lambda: nodes[2].ended) is not None, "the leaving node never heard that the job ended"
        with pytest.raises(ExchangeFailed, match="exit code 143"):  # not "not every node answered … in time"
            nodes[2].reduce("cand", 1, time.monotonic() + 5, "count")


def test_a_node_that_never_reaches_the_plane_is_left_out_after_the_last_call_at_the_first_start() -> None:
    """Nodes 0 and 2 of "2:3" start; node 1's mlaunch never does: they start without it after the last call."""
    port = free_port()
    nodes = [agent(n, port, 10.0, (2, 3), last_call=1.0, join_timeout=30.0) for n in (0, 2)]
    try:
        started = time.monotonic()
        first = meet(nodes, "0", 0)
        waited = time.monotonic() - started
        assert [r.members for r in first] == [(0, 2), (0, 2)]
        assert [d.node for d in first[0].left] == [1] and "last call" in first[0].left[0].why
        assert waited >= 1.0  # the last call was waited for, not skipped
        late = agent(1, port, 10.0, (2, 3))  # it starts after all: a candidate, admitted at the next meeting
        try:
            assert late.joined(time.monotonic() + 5) and late.candidate
            assert until(lambda: nodes[0].waiting() == [1])
            second = meet(nodes, "1", 1)
            admitted = late.admission(5)
            assert isinstance(admitted, Meeting) and admitted == second[0] and admitted.members == (0, 1, 2)
        finally:
            late.close(0)
    finally:
        for events in reversed(nodes):
            events.close(0)


def test_a_candidate_admitted_before_its_mlaunch_looked_starts_in_that_generation(tmp_path: Any) -> None:
    """A 300-fault storm restarted node 2's mlaunch just as node 0 and node 1 met after a failure: the meeting
    admitted the new candidate before its mlaunch checked whether it was one. It took itself for a member,
    asked for generation 0's meeting, got that old result and started generation 0's ranks beside
    generation 5's — both sides then waited for each other until the job failed. It starts in the
    generation that admitted it (``launchers.run.membership._join``)."""
    from types import SimpleNamespace

    from launchers.config.loader import parse_job
    from launchers.run.membership import _join

    job = parse_job("entry: train.py\nnodes: 3\npytorch: {nnodes: '2:3'}\n", tmp_path / "job.yaml")
    with plane((2, 3)) as (nodes, port):
        meet(nodes, "0", 0)
        vanish(nodes[2])
        next_event(nodes[0], Left)
        back = agent(2, port, 10.0, (2, 3))  # its mlaunch started again: a candidate...
        try:
            assert until(lambda: nodes[0].waiting() == [2])
            admitted = meet(nodes[:2], "1", 1)  # ...admitted by the meeting after the failure
            assert until(lambda: back.admission(0.0) is not None) and not back.candidate
            elastic = SimpleNamespace(job=job, events=back, restarts=0)
            meeting = _join(elastic)  # type: ignore[arg-type]
            assert isinstance(meeting, Meeting) and meeting == admitted[0]
            assert meeting.generation == 1 and meeting.members == (0, 1, 2)
        finally:
            back.close(0)


def test_a_repeated_meeting_answer_keeps_a_departure_that_came_after_it() -> None:
    """The hub answers a meeting again when the agent says it again (a late second welcome makes it resend
    what is pending). CI under load lost node 2's departure that way: the repeat cleared the ``Left`` that
    arrived between the two answers, as a new meeting must. A repeat is dropped."""
    from launchers.control import messages as m
    from launchers.control.agent_core import AgentState

    state = AgentState(node=1, nnodes=3, node_timeout=10.0, join_timeout=10.0, host="h1")
    met = m.Met("0", 0, (0, 1, 2))
    state.on_message(met, time.monotonic())
    state.on_message(m.Left(m.Departure(2, "h2", "its mlaunch started again"), 2), time.monotonic())
    state.on_message(met, time.monotonic())
    assert [e.node for e in state.events if isinstance(e, Left)] == [2]
    state.on_message(m.Met("1", 1, (0, 1)), time.monotonic())
    assert not [e for e in state.events if isinstance(e, Left)], "a new meeting carries what changed before it"
