"""The hub's membership decisions without a socket: state in, effects out (``launchers/control/membership.py``).

Each decision changes the hub's record of the nodes (``Roster``: one ``NodeStatus`` per node)
through named transitions and returns what the hub must do, in order. These tests drive the
decisions directly; ``tests/test_membership_plane.py`` runs the same cases over real sockets.
The node lives themselves (``roster`` at the hub, ``life`` at an agent) refuse a move their
diagrams do not have.
"""

from __future__ import annotations

import pytest

from launchers.control import messages as m
from launchers.control.effects import Broadcast, Drop, EndJob, Multicast, Send, VoidExchanges
from launchers.control.life import AgentPhase, IllegalPhase, Life
from launchers.control.membership import Membership
from launchers.control.roster import IllegalTransition, NodeStatus, Roster

BASE = m.Welcome(3, 0.5, 1.0, 1.0)


def membership(span: tuple[int, int] | None, nnodes: int = 3) -> Membership:
    roster = Roster(nnodes)
    for node in range(nnodes):
        roster.hosts[node] = f"h{node}"
        roster.heard(node, 0.0)
    return Membership(roster, span, node_timeout=10.0)


def meet(plane: Membership, key: str, nodes: list[int], generation: int = 1, admit: bool = True) -> list:
    effects = []
    for node in nodes:
        effects += plane.on_meet(m.Meet(node, key, generation, 0, admit))
    return effects


def met(effects: list) -> m.Met:
    (result,) = [e.message for e in effects if isinstance(e, Multicast)]
    assert isinstance(result, m.Met)
    return result


def test_shrink_a_silent_member_is_left_out_exchanges_are_void_and_the_meeting_goes_on_without_it() -> None:
    plane = membership((2, 3))
    effects = plane.on_silent(2, 11.0, now=100.0)
    assert [type(e) for e in effects] == [Drop, Broadcast, VoidExchanges]
    drop, told, void = effects
    assert drop == Drop(2, m.LeftOut(2, "h2", Membership.out_reason("its mlaunch sent nothing for 11.0s")))
    assert told.message == m.Left(m.Departure(2, "h2", "its mlaunch sent nothing for 11.0s", 11.0), 2)
    assert "node 2 left the job" in void.reason
    assert plane.roster.of(2) is NodeStatus.LEFT_OUT and plane.roster.members == {0, 1}
    assert not plane.current(m.Put(1, "bg/a/ok", "and", True, epoch=0))  # made under the old membership
    result = met(meet(plane, "1", [0, 1]))
    assert result.members == (0, 1) and [d.node for d in result.left] == [2] and result.joined == ()
    assert plane.current(m.Put(1, "start/2", "count", None, epoch=result.epoch))


def test_a_close_that_a_departure_explains_leaves_the_other_members_their_node_timeout() -> None:
    """The socket monitor says a connection closed, not whose: a departure's close is expected.

    Found by the chaos storm: node 2 was left out behind a link cut; its mlaunch ended when the link
    came back, and that close put every member on the short fuse — node 1, silent 1.6 s behind node
    0's own 1.1 s link flap, was judged lost and the job ended below MIN.
    """
    plane = membership((2, 3))
    plane.on_silent(2, 11.0, now=100.0)  # left out; its mlaunch will end and close its connection
    plane.on_close(now=103.0)
    assert plane.silence_limit(now=104.0, heartbeat=0.5) == 10.0  # node 1 keeps node_timeout
    plane.on_close(now=105.0)  # a close nobody explains: a member's mlaunch likely died
    assert plane.silence_limit(now=106.0, heartbeat=0.5) < 2.0
    assert plane.silence_limit(now=116.0, heartbeat=0.5) == 10.0  # node_timeout after that close


def test_a_killed_members_own_close_is_not_expected_again() -> None:
    """A member whose close came after its last message is judged on it; its departure expects nothing more."""
    plane = membership((2, 4), nnodes=4)
    plane.roster.heard(2, 99.0)
    plane.on_close(now=100.0)  # node 2's mlaunch was killed
    plane.on_silent(2, 1.6, now=100.6)
    assert plane.closing == {}
    plane.on_close(now=101.0)  # node 3's mlaunch killed too: it is not taken for node 2's
    assert plane.silence_limit(now=101.5, heartbeat=0.5) < 2.0


def test_only_a_node_silent_since_before_an_unexplained_close_is_on_the_short_fuse() -> None:
    """A node heard after the close is not the one whose connection closed: it keeps ``node_timeout``."""
    plane = membership((2, 4), nnodes=4)
    plane.roster.heard(2, 99.0)  # node 2's last message; its mlaunch is killed and its connection closes
    plane.on_close(now=100.0)
    plane.roster.heard(1, 100.2)  # node 1 still beats
    assert plane.silence_limit(now=101.0, heartbeat=0.5, heard=99.0) < 2.0
    assert plane.silence_limit(now=101.0, heartbeat=0.5, heard=100.2) == 10.0
    effects = plane.on_silent(2, 1.6, now=100.6)
    assert "after a connection to the control plane closed" in effects[1].message.departure.why


@pytest.mark.parametrize("close_first", [True, False], ids=["close-then-hello", "hello-then-close"])
def test_a_restarted_mlaunchs_old_connection_closing_puts_nobody_on_the_short_fuse(close_first: bool) -> None:
    """CI: node 2's mlaunch started again; its old connection's close, unexplained, judged node 1 (heartbeats
    late on a loaded machine) after 1.5 s, and node 2's restart then found too few members to leave it out."""
    plane = membership((2, 3))
    plane.on_hello(m.Hello(2, "h2", "old", 0), BASE)
    plane.restarted(m.Hello(2, "h2", "old", 0), now=1.0)
    plane.roster.heard(1, 99.0)
    plane.roster.heard(2, 99.5)
    if close_first:
        plane.on_close(now=100.0)
    effects = plane.restarted(m.Hello(2, "h2", "new", 0), now=100.1)
    assert [type(e) for e in effects] == [Drop, Broadcast, VoidExchanges]
    assert "started again" in effects[1].message.departure.why
    if not close_first:
        plane.on_close(now=100.2)
    assert plane.silence_limit(now=101.0, heartbeat=0.5, heard=99.0) == 10.0  # node 1 keeps node_timeout


def test_first_start_a_node_never_heard_is_left_out_after_the_last_call_once_min_met() -> None:
    """A 300-fault storm killed a node's mlaunch before its hello reached the hub: the others waited 81 s.

    A node never heard is never judged by its silence; without a last call an elastic job waits for it
    up to ``monitor.join_timeout`` and then fails to start. torchrun starts with MIN after its last call.
    """
    roster = Roster(3)
    for node in (0, 2):
        roster.hosts[node] = f"h{node}"
        roster.heard(node, 0.0)
    plane = Membership(roster, (2, 3), node_timeout=3.0, last_call=30.0)
    assert meet(plane, "0", [0, 2], generation=0) == []  # node 1 is still a member: the meeting waits
    assert plane.on_tick(now=100.0) == []  # MIN met: the last call starts
    assert plane.on_tick(now=129.0) == []
    effects = plane.on_tick(now=130.5)
    assert [type(e) for e in effects] == [Drop, Broadcast, VoidExchanges, Multicast]
    result = met(effects)
    assert result.members == (0, 2) and [d.node for d in result.left] == [1]
    assert "never reached the control plane" in result.left[0].why and "last call" in result.left[0].why
    assert plane.roster.of(1) is NodeStatus.LEFT_OUT
    plane.on_hello(m.Hello(1, "h1", "inc-1"), BASE)  # its mlaunch starts after all: a candidate, as any
    assert plane.roster.of(1) is NodeStatus.CANDIDATE


def test_the_last_call_waits_for_min_spares_heard_members_and_needs_a_range() -> None:
    below = Membership(Roster(3), (3, 3), node_timeout=3.0, last_call=1.0)
    below.roster.heard(0, 0.0)
    below.roster.heard(1, 0.0)
    meet(below, "0", [0, 1], generation=0)
    assert below.on_tick(now=10.0) == [] and below.on_tick(now=20.0) == []  # 2 met, MIN is 3: wait
    late = Membership(Roster(3), (2, 3), node_timeout=3.0, last_call=30.0)
    for node in (0, 2):
        late.roster.heard(node, 0.0)
    meet(late, "0", [0, 2], generation=0)
    late.on_tick(now=10.0)  # the last call starts...
    late.roster.heard(1, 12.0)
    assert met(meet(late, "0", [1], generation=0)).members == (0, 1, 2)  # ...and node 1 came in time
    assert late.quorum_since == {} and late.on_tick(now=100.0) == []
    heard = membership((2, 3))  # every node heard: a silent one is judged by node_timeout, not the last call
    meet(heard, "0", [0, 2], generation=0)
    assert heard.on_tick(now=10.0) == [] and heard.on_tick(now=100.0) == []
    fixed = Membership(Roster(3), None, node_timeout=3.0, last_call=1.0)
    fixed.roster.heard(0, 0.0)
    fixed.roster.heard(2, 0.0)
    meet(fixed, "0", [0, 2], generation=0)
    assert fixed.on_tick(now=10.0) == [] and fixed.on_tick(now=100.0) == []


def test_grow_a_node_that_says_hello_waits_and_the_next_meeting_admits_it_up_to_max() -> None:
    plane = membership((2, 3))
    plane.on_silent(2, 11.0, now=100.0)
    meet(plane, "1", [0, 1])
    (send,) = plane.on_hello(m.Hello(2, "h2", "new"), BASE)
    assert isinstance(send, Send) and send.node == 2
    assert send.message == m.Welcome(3, 0.5, 1.0, 1.0, candidate=True, in_job=2, max_nodes=3)
    assert plane.roster.nodes(NodeStatus.CANDIDATE) == [2] and plane.roster.members == {0, 1}
    assert meet(plane, "h", [0, 1], admit=False)[0].message.joined == ()  # the health check's meeting admits nobody
    result = met(meet(plane, "2", [0, 1], generation=2))
    assert result.members == (0, 1, 2) and result.joined == (m.Joined(2, "h2"),) and result.generation == 2
    assert plane.roster.of(2) is NodeStatus.MEMBER


def test_only_a_waiting_candidate_can_be_ready_and_its_readiness_ends_with_its_wait() -> None:
    plane = membership((2, 3))
    plane.on_silent(2, 11.0, now=100.0)
    assert plane.on_ready(1) == [] and plane.roster.ready == set()  # a member has nothing to be ready for
    plane.on_hello(m.Hello(2, "h2", "new"), BASE)
    version = plane.roster.version
    assert plane.on_ready(2) == [] and plane.roster.ready == {2} and plane.roster.version == version + 1
    plane.on_ready(2)
    assert plane.roster.version == version + 1  # said again: nothing new to publish
    meet(plane, "2", [0, 1], generation=2)
    assert plane.roster.of(2) is NodeStatus.MEMBER and plane.roster.ready == set()
    plane.on_silent(2, 11.0, now=200.0)
    plane.on_hello(m.Hello(2, "h2", "newer"), BASE)  # a new mlaunch there warms its standbys again
    assert plane.roster.nodes(NodeStatus.CANDIDATE) == [2] and plane.roster.ready == set()


def test_regroup_is_asked_once_while_a_candidate_waits_and_the_meeting_says_why() -> None:
    plane = membership((2, 3))
    assert plane.regroup("nobody waits") == []
    plane.on_silent(2, 11.0, now=100.0)
    meet(plane, "1", [0, 1])
    plane.on_hello(m.Hello(2, "h2", "new"), BASE)
    assert plane.regroup("node 2 waits to join") == [Broadcast(m.Regroup(0, "node 2 waits to join"))]
    assert plane.regroup("again") == []
    result = met(meet(plane, "2", [0, 1]))
    assert result.regroup == "node 2 waits to join" and result.members == (0, 1, 2)


def test_a_rejoin_during_a_shrink_the_meeting_in_flight_ends_without_it_and_the_next_admits_it() -> None:
    plane = membership((2, 3))
    plane.restarted(m.Hello(2, "h2", "first"), now=0.0)
    assert meet(plane, "1", [0, 1]) == []  # node 2 has not come yet
    effects = plane.restarted(m.Hello(2, "h2", "second"), now=5.0)  # its mlaunch started again
    assert plane.roster.of(2) is NodeStatus.LEFT_OUT
    assert "started again" in effects[1].message.departure.why
    result = met(effects)  # the departure completed the meeting the others were waiting in
    assert result.members == (0, 1) and [d.node for d in result.left] == [2]
    plane.on_hello(m.Hello(2, "h2", "second"), BASE)
    assert plane.roster.of(2) is NodeStatus.CANDIDATE
    assert met(meet(plane, "2", [0, 1])).joined == (m.Joined(2, "h2"),)


def test_a_member_that_finished_while_the_others_meet_ends_the_job_with_code_0() -> None:
    """Found by the 300-fault storm: node 0 asked to regroup for a ready candidate as the job's
    last step ended; a member's ranks had exited 0 and its mlaunch said bye, and node 0 waited
    at the meeting for it until it failed the job ("not every node came to the meeting")."""

    def regrouped() -> Membership:
        plane = membership((2, 3))
        plane.on_silent(2, 11.0, now=100.0)
        meet(plane, "1", [0, 1])
        plane.on_hello(m.Hello(2, "h2", "new"), BASE)
        plane.regroup("node 2 waits to join")
        return plane

    def finished(effects: list) -> None:
        (end,) = effects
        assert isinstance(end, EndJob) and (end.message.node, end.message.exit_code) == (1, 0)
        assert "node 1's training finished" in end.message.why

    plane = regrouped()  # the bye comes while node 0 waits at the meeting
    assert meet(plane, "2", [0]) == []
    finished(plane.on_bye(1, 0, now=120.0))
    assert plane.meetings == {}
    plane = regrouped()  # the bye comes first
    assert plane.on_bye(1, 0, now=120.0) == []
    finished(meet(plane, "2", [0]))
    assert plane.roster.nodes(NodeStatus.CANDIDATE) == [2]  # nobody was admitted to a finished job
    plane = regrouped()  # a member that failed is left out, as before: the others re-form
    plane.on_bye(1, 1, now=120.0)
    assert met(meet(plane, "2", [0])).members == (0, 2)
    fixed = membership(None)  # without a range a bye changes nothing: node 0's end ends the job
    assert fixed.on_bye(1, 0, now=1.0) == [] and meet(fixed, "1", [0, 2]) == []


def test_a_meeting_said_again_gets_its_answer_again_but_never_by_a_node_no_longer_in_it() -> None:
    """A member whose answer was lost asks again and gets the same one; a node that was left out and came
    back (a candidate now) never gets an old generation's answer: it would start that generation's ranks
    beside the running job's (a storm found that on the agent side: generation 0 beside generation 5)."""
    plane = membership((2, 3))
    first = met(meet(plane, "0", [0, 1, 2], generation=0))
    assert plane.on_meet(m.Meet(1, "0", 0, 0, True)) == [Send(first, 1)]
    plane.on_silent(2, 11.0, now=100.0)
    plane.on_hello(m.Hello(2, "h2", "new"), BASE)
    assert plane.roster.of(2) is NodeStatus.CANDIDATE
    assert plane.on_meet(m.Meet(2, "0", 0, 0, True)) == []


def test_a_graceful_leave_a_waiting_candidate_fills_the_minimum() -> None:
    plane = membership((2, 3))
    plane.on_silent(1, 11.0, now=100.0)
    meet(plane, "1", [0, 2])
    plane.on_hello(m.Hello(1, "h1", "back"), BASE)
    effects = plane.on_leaving(2, "SIGTERM (a preemption)", now=120.0)
    assert [type(e) for e in effects] == [Drop, Broadcast, VoidExchanges]
    assert effects[0] == Drop(2)  # not told it is out: it said so itself
    assert effects[1].message.departure == m.Departure(2, "h2", "SIGTERM (a preemption)", 0.0, graceful=True)
    result = met(meet(plane, "2", [0]))  # node 0 alone: the leaving node is not waited for
    assert result.members == (0, 1) and result.joined == (m.Joined(1, "h1"),) and result.left[-1].graceful


def test_a_graceful_leave_below_the_minimum_ends_the_job_on_every_node() -> None:
    plane = membership((3, 3))
    (effect,) = plane.on_leaving(2, "SIGTERM (a preemption)", now=1.0)
    assert isinstance(effect, EndJob) and effect.message.node == 2 and effect.message.exit_code == 143
    assert "node 2 is leaving" in effect.message.why and "below the elastic minimum 3" in effect.message.why
    assert plane.roster.of(2) is NodeStatus.MEMBER  # still one of the job's nodes: its end follows


def test_node_0_lost_ends_the_job_and_so_does_any_loss_without_a_range() -> None:
    plane = membership((2, 3))
    (effect,) = plane.on_silent(0, 11.0, now=100.0)
    assert isinstance(effect, Broadcast) and isinstance(effect.message, m.Lost) and effect.message.node == 0
    assert "node 0 hosts the control plane" in effect.message.why
    assert plane.roster.of(0) is NodeStatus.LOST and 0 in plane.roster.members
    fixed = membership(None)
    assert fixed.on_silent(2, 11.0, now=100.0) == [Broadcast(m.Lost(2, "h2", 11.0, ""))]
    assert fixed.roster.of(2) is NodeStatus.LOST


def test_bye_said_by_a_member_a_candidate_and_a_member_that_failed() -> None:
    plane = membership((2, 3))
    assert plane.on_bye(1, 0, now=1.0) == [] and plane.roster.of(1) is NodeStatus.SAID_BYE
    plane.on_hello(m.Hello(1, "h1"), BASE)
    assert plane.roster.of(1) is NodeStatus.MEMBER  # its mlaunch came back
    plane.on_silent(2, 11.0, now=2.0)
    plane.on_hello(m.Hello(2, "h2", "new"), BASE)
    assert plane.on_bye(2, 0, now=3.0) == [Drop(2)] and plane.roster.of(2) is None  # never admitted
    wide = membership((2, 3))
    assert [type(e) for e in wide.on_bye(2, 1, now=1.0)] == [Drop, Broadcast, VoidExchanges]
    assert wide.roster.of(2) is NodeStatus.LEFT_OUT
    assert not wide.roster.everyone_left()  # node 1 still listens
    wide.on_bye(1, 0, now=2.0)
    assert wide.roster.everyone_left()


def test_a_silent_candidate_is_dropped_and_a_node_cannot_be_in_two_states() -> None:
    plane = membership((2, 3))
    plane.on_silent(2, 11.0, now=100.0)
    plane.on_hello(m.Hello(2, "h2", "new"), BASE)
    assert plane.on_silent(2, 11.0, now=120.0) == [Drop(2)] and plane.roster.of(2) is None
    roster = plane.roster
    with pytest.raises(IllegalTransition, match="node 1 is member, not candidate"):
        roster.admit(1)
    with pytest.raises(IllegalTransition):
        roster.rejoin(1)
    roster.lose(1)
    with pytest.raises(IllegalTransition):
        roster.leave_out(1)
    assert roster.quiet == {1} and roster.members == {0, 1}


def test_an_agents_life_moves_only_along_its_diagram() -> None:
    life = Life()
    assert life.phase is AgentPhase.JOINING and not life.admit()
    life.welcome(candidate=True)
    assert life.phase is AgentPhase.CANDIDATE and life.welcomed
    life.welcome(candidate=False)  # a rejoin's welcome does not admit it: a meeting does
    assert life.phase is AgentPhase.CANDIDATE and life.admit() and life.phase is AgentPhase.MEMBER
    life.closing()
    assert life.phase is AgentPhase.CLOSING and life.end(AgentPhase.ENDED)
    assert not life.end(AgentPhase.LOST) and life.phase is AgentPhase.ENDED  # the first end stands
    life.welcome(candidate=False)
    assert life.phase is AgentPhase.ENDED
    with pytest.raises(IllegalPhase, match="member is not an end"):
        Life().end(AgentPhase.MEMBER)
