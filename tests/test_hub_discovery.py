"""A starting mlaunch finds a hub that moved (issue 45, item 3): the old node 0 comes back as a candidate.

The decision (``control.discovery``: whom to probe, whom to join) is pure and tested on its own;
the probe (``control.hub_probe``) and the plane over loopback TCP are real: real hubs, real
``NetworkEvents`` agents, real CURVE. Every node shares 127.0.0.1 here (as in test_hub_moves.py),
so a probe of "node 2's host" reaches whichever hub holds the port; across hosts:
tests/test_hub_moves_hosts.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from plane_helpers import together, until
from test_hub_moves import KEY, agent, meet, next_event, plane, vanish

from launchers.control.discovery import Answer, Place, decide, targets
from launchers.platform.cluster import free_port

zmq = pytest.importorskip("zmq")

HOSTS = ("w-0", "w-1", "w-2")


# -- the decisions --------------------------------------------------------------------------------
def test_only_a_job_whose_hub_can_move_probes_and_never_its_own_port_or_the_master() -> None:
    assert targets(0, movable=True, hosts=HOSTS) == (1, 2)
    assert targets(2, movable=True, hosts=HOSTS) == (1,)  # node 0's is the master address: it goes there anyway
    assert targets(0, movable=False, hosts=HOSTS) == ()  # no range or no host list: the hub never moves
    assert targets(0, movable=True, hosts=[f"w-{n}" for n in range(4096)]) == tuple(range(1, 17))  # the lowest
    assert targets(0, movable=True, hosts=("a", "b", "b", "c")) == (1, 3)  # one host's port is one hub: probed once


def test_a_hub_that_answered_is_joined_else_node_0_hosts_as_at_any_first_start() -> None:
    found = decide(0, {1: Answer.HUB, 2: Answer.ABSENT}, hub=1)
    assert (found.host, found.join) == (False, 1) and "node 1" in found.said
    assert decide(0, {1: Answer.ABSENT, 2: Answer.ABSENT}, hub=None) == Place(host=True, join=None)  # a fresh start
    assert decide(0, {}, hub=None) == Place(host=True, join=None)  # nothing probed: as before
    assert decide(2, {1: Answer.ABSENT}, hub=None) == Place(host=False, join=None)  # to the master address
    unclear = decide(0, {1: Answer.STRANGER, 2: Answer.SILENT}, hub=None)
    assert unclear.host and "node 1: something without the job's key" in unclear.said
    assert "node 2: no answer in time" in unclear.said
    assert decide(0, {1: Answer.ABSENT}, hub=1).host  # a named hub without an answer is none


# -- the probe ------------------------------------------------------------------------------------
def _state(node: int) -> Any:
    from launchers.control.agent_core import AgentState

    return AgentState(node, 3, 3.0, 3.0, f"h{node}", elastic=(2, 3))


def test_the_probe_hears_the_job_s_hub_and_only_it_and_waits_a_bounded_time() -> None:
    """Another job's hub (another key) completes no handshake and answers nothing; a closed port is known at
    once; a port that accepts the connection and says nothing is given ``ANSWER_WAIT``, no longer."""
    import socket

    from launchers.control.hub import Hub
    from launchers.control.hub_probe import ANSWER_WAIT, probe
    from launchers.control.transport import curve_keys

    context = zmq.Context.instance()
    ours, theirs, closed = free_port(), free_port(), free_port()
    hubs = [Hub(context, ours, KEY, 3, 3.0, (2, 3)), Hub(context, theirs, b"x" * 32, 3, 3.0, (2, 3))]
    mute = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nothing ever speaks
    for hub in hubs:
        hub.start()
    try:
        state = _state(0)
        addresses = {1: f"tcp://127.0.0.1:{theirs}", 2: f"tcp://127.0.0.1:{closed}"}
        answers, sock = probe(context, curve_keys(KEY), KEY, state, addresses)
        assert answers == {1: Answer.STRANGER, 2: Answer.ABSENT} and sock is None and not state.welcomed
        began = time.monotonic()
        answers, sock = probe(context, curve_keys(KEY), KEY, state, {1: f"tcp://127.0.0.1:{mute.getsockname()[1]}"})
        assert answers == {1: Answer.SILENT} and sock is None
        assert ANSWER_WAIT <= time.monotonic() - began < ANSWER_WAIT + 1.5
        answers, sock = probe(context, curve_keys(KEY), KEY, state, {1: f"tcp://127.0.0.1:{ours}"})
        assert answers == {1: Answer.HUB} and sock is not None and state.welcomed and state.hub == 0
        sock.close(0)
    finally:
        mute.close()
        for hub in hubs:
            hub.stop()


# -- the real plane -------------------------------------------------------------------------------
def test_the_old_node_0_restarted_joins_the_moved_hub_as_a_candidate_and_is_admitted() -> None:
    from launchers.control import Left

    with plane((2, 3)) as nodes:
        assert not any(x.hub is None for x in nodes[:1]) and not any(x.hosting for x in nodes[1:])  # node 0 hosts
        meet(nodes, "0", 0)
        vanish(nodes[0])
        assert all(next_event(n, Left) is not None for n in nodes[1:])
        assert until(lambda: nodes[1].hosting)
        assert [x.members for x in meet(nodes[1:], "1", 1)] == [(1, 2)] * 2
        back = agent(0, nodes[1].port, (2, 3))  # the platform restarted it: rank 0, the same environment
        try:
            assert not back.hosting and back.joined(time.monotonic() + 5) and back.candidate, back.state.phase
            assert back.state.hub == 1  # its welcome named where the hub runs
            assert until(lambda: nodes[1].waiting() == [0])
            grown = meet(nodes[1:], "2", 2)  # the next membership change (at_restart: the next meeting)
            assert [x.members for x in grown] == [(0, 1, 2)] * 2 and [n for n, _ in grown[0].joined] == [0]
            admitted = back.admission(5.0)
            assert admitted is not None and admitted.members == (0, 1, 2), (back.state.phase, back.state.final)
            three = [back, *nodes[1:]]
            assert together(three, lambda n: n.reduce("start/2", None, time.monotonic() + 5, "count")) == [3, 3, 3]
        finally:
            back.close(0)  # before the hub's node closes: it waits for every node to leave


def test_a_first_start_s_hub_acts_on_no_socket_that_did_not_say_hello() -> None:
    """Node 0's mlaunch started again before the others moved the hub: their sockets reconnect to its new hub by
    themselves and heartbeat without a hello. Acted on, those heartbeats would keep them from ever moving; the
    hub ignores them (counted, said once), and welcomes the same socket once it says hello."""
    from launchers.control import messages as m
    from launchers.control.hub import Hub
    from launchers.control.transport import curve_keys, secure_agent
    from launchers.control.wire import Outgoing, seal

    context = zmq.Context.instance()
    port = free_port()
    hub = Hub(context, port, KEY, 3, 3.0, (2, 3))
    hub.start()
    sock = context.socket(zmq.DEALER)
    try:
        secure_agent(sock, curve_keys(KEY), 3)
        sock.setsockopt(zmq.IDENTITY, b"node-1-member")
        sock.connect(f"tcp://127.0.0.1:{port}")
        stream = Outgoing()
        for _ in range(3):
            sock.send_multipart(seal(KEY, m.Heartbeat(1).to_wire(), stream))
        assert until(lambda: hub.dropped.ungreeted == 3) and 1 not in hub.peers
        assert not sock.poll(1500)  # nothing said to it: no heartbeat, no welcome (the hub beats every 0.5 s)
        sock.send_multipart(seal(KEY, m.Hello(1, "h1", "member", 0).to_wire(), stream))
        assert sock.poll(3000) and until(lambda: 1 in hub.peers)
        sock.send_multipart(seal(KEY, m.Heartbeat(1).to_wire(), stream))
        assert until(lambda: hub.traffic.messages_in == 5) and hub.dropped.ungreeted == 3
    finally:
        sock.close(0)
        hub.stop()
