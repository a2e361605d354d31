"""The control plane's messages on real loopback sockets (issue 24): reductions, joins, rejoins, misbehaving peers.

Agents are the real ``NetworkEvents``; where many are needed they share one ``Driver``
thread (as ``benchmarks/control_scale.py`` runs thousands), so each still has its own DEALER
socket and TCP connection to node 0's hub. Peers that misbehave (never read, sign with
another key, claim a node index out of range) are raw pyzmq sockets speaking the wire format.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from launchers.control import ExchangeFailed, Lost, RemoteFailure
from launchers.control.transport import curve_keys, secure_agent
from launchers.control.wire import seal, unseal
from launchers.outcome import Failure
from launchers.platform.cluster import free_port

zmq = pytest.importorskip("zmq")

KEY = b"k" * 32


@contextmanager
def plane(nnodes: int, node_timeout: float = 5.0, port: int = 0, started: int = 0) -> Iterator[list[Any]]:
    """Node 0 (hosting the hub, its own driver) and nodes 1 … ``started``-1 on one shared driver."""
    from launchers.control.agent import NetworkEvents
    from launchers.control.driver import Driver

    port = port or free_port()
    node0 = NetworkEvents(
        node=0, nnodes=nnodes, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=node_timeout
    )
    driver = Driver(zmq.Context(), KEY)
    driver.start()
    others = [
        NetworkEvents(
            node=n, nnodes=nnodes, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=node_timeout,
            driver=driver, host=f"h{n}",
        )
        for n in range(1, started or nnodes)
    ]  # fmt: skip
    try:
        yield [node0, *others]
    finally:
        for events in others:
            events.close(0)
        node0.close(0)
        driver.stop()
        driver.context.term()


def until(check: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    return check()


def reduce_all(nodes: list[Any], topic: str, values: list[Any], how: Any) -> list[Any]:
    """Every node's part, contributed together (the answers come once the last one is in)."""
    for events, value in zip(nodes, values, strict=True):
        events.state.contribute(topic, value, how)
        events.driver.kick()
    return [events.state.result(topic, time.monotonic() + 5) for events in nodes]


def test_each_node_gets_the_aggregate_or_its_share_not_every_value() -> None:
    with plane(4) as nodes:
        assert reduce_all(nodes, "start/1", [None] * 4, "count") == [4] * 4
        assert reduce_all(nodes, "cand/a", [[3, 4, 5], [4, 5], [5, 4, 9], [1, 4, 5]], "intersect") == [[4, 5]] * 4
        sizes = reduce_all(nodes, "done/a", [{"0": 10}, {"1": 11}, {"2": 12}, {"3": 13}], "gather0")
        assert sizes[0] == {"0": {"0": 10}, "1": {"1": 11}, "2": {"2": 12}, "3": {"3": 13}}
        assert sizes[1:] == [None, None, None]  # only node 0 commits: only node 0 gets the sizes
        turns = reduce_all(nodes, "hello", ["boot-a", "boot-b", "boot-a", "boot-a"], "group_rank")
        assert [t["index"] for t in turns] == [0, 0, 1, 2] and {t["most"] for t in turns} == {3}
        mixed = reduce_all(nodes, "bg/1", [{"ok": True, "next": n} for n in (4, 8, 6, 2)], {"ok": "and", "next": "max"})
        assert mixed == [{"ok": True, "next": 8}] * 4
        verdict = {"all": {"bad": [2]}, "each": {"1": "ok", "2": "slow", "3": "ok"}}
        told = reduce_all(nodes, "verdict", [verdict, None, None, None], "scatter0")
        assert told[2] == {"all": {"bad": [2]}, "mine": "slow"} and told[3]["mine"] == "ok"


def test_a_reduction_the_nodes_disagree_on_fails_on_every_node() -> None:
    with plane(3) as nodes:
        for events, how in zip(nodes, ("max", "max", "min"), strict=True):
            events.state.contribute("x/1", 1, how)
            events.driver.kick()
        for events in nodes:
            with pytest.raises(ExchangeFailed, match="disagree"):
                events.state.result("x/1", time.monotonic() + 5)
        with pytest.raises(ExchangeFailed, match="unknown reduction"):
            reduce_all(nodes, "y/1", [1, 2, 3], "median")


def test_status_goes_up_only_and_node_0s_summary_comes_down() -> None:
    with plane(3) as nodes:
        for events in nodes:
            events.publish({"index": events.node, "ranks": [{"rank": events.node, "step": 7}]})
        assert until(lambda: len(nodes[0].view()) == 3)  # node 0 keeps every node's entry
        nodes[0].publish_summary({"phase": "running", "stragglers": [5]})
        assert until(lambda: nodes[2].summary().get("stragglers") == [5])
        assert sorted(nodes[1].view()) == [1]  # nobody pushed the whole view down
        nodes[1].request_view()
        assert until(lambda: sorted(nodes[1].view()) == [0, 1, 2])


def test_sixty_four_agents_joining_at_once_all_join_and_meet() -> None:
    with plane(64) as nodes:
        assert until(lambda: all(events.state.welcomed for events in nodes), 20)
        assert reduce_all(nodes, "start/1", [None] * 64, "count") == [64] * 64
        hub = nodes[0].hub
        assert len(hub.hosts) == 64 and hub.rejected == 0


def test_a_hub_that_starts_late_gets_each_join_without_a_backlog() -> None:
    """Before node 0 is up the agent's socket queues nothing: the hub hears one hello, not every heartbeat since."""
    from launchers.control.agent import NetworkEvents

    port = free_port()
    late = NetworkEvents(
        node=1, nnodes=2, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=0.5, join_timeout=30
    )
    time.sleep(2.0)  # four node_timeouts: a node that has not joined yet waits join_timeout instead
    node0 = NetworkEvents(node=0, nnodes=2, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=5)
    try:
        assert until(lambda: late.state.welcomed, 10) and late.lost is None
        assert node0.hub is not None and node0.hub.traffic.messages_in < 20
        assert reduce_all([node0, late], "start/1", [None, None], "count") == [2, 2]
    finally:
        late.close(0)
        node0.close(0)


def test_a_rejoining_agent_learns_the_first_failure_and_its_contribution_counts_once() -> None:
    """Node 2's mlaunch restarts its agent (a new socket, a new identity) within node_timeout: nothing is lost."""
    from launchers.control.agent import NetworkEvents

    port = free_port()
    with plane(3, port=port) as nodes:
        nodes[2].state.contribute("start/1", None, "count")
        nodes[2].driver.kick()
        assert until(lambda: len(nodes[0].gathered("start/1")) == 1)
        nodes[2].driver.remove(nodes[2].state)  # its socket is gone, no farewell said
        nodes[1].report_failure(Failure("rank 1", 1, 1, 9, None, [], None))
        assert until(lambda: nodes[0].first_failure(0))
        again = NetworkEvents(node=2, nnodes=3, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=5)
        try:
            first = again.first_failure(0, 5)
            assert isinstance(first, RemoteFailure) and first.node == 1  # told in its welcome
            assert reduce_all(nodes[:2] + [again], "start/1", [None] * 3, "count") == [3, 3, 3]
            assert nodes[0].lost is None
        finally:
            again.close(0)


def test_a_node_declared_lost_that_comes_back_is_told_so_at_once() -> None:
    from launchers.control.agent import NetworkEvents

    port = free_port()
    with plane(2, node_timeout=0.6, port=port) as nodes:
        assert until(lambda: nodes[1].state.welcomed)
        nodes[1].driver.remove(nodes[1].state)
        assert until(lambda: isinstance(nodes[0].lost, Lost))
        back = NetworkEvents(node=1, nnodes=2, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=0.6)
        try:
            assert until(lambda: back.lost is not None, 3) and back.lost.node == 1
        finally:
            back.close(1)


def test_a_peer_that_never_reads_does_not_hold_up_the_others() -> None:
    """A node whose socket stops reading (a stuck process): the hub drops what it cannot take and serves the rest."""
    port = free_port()
    with plane(3, node_timeout=1.0, port=port, started=2) as nodes:  # node 2 is the stuck socket (lost at the end)
        context = zmq.Context()
        stuck = context.socket(zmq.DEALER)
        stuck.setsockopt(zmq.RCVHWM, 1)
        secure_agent(stuck, curve_keys(KEY), 3)
        stuck.connect(f"tcp://127.0.0.1:{port}")
        try:
            stuck.send_multipart(seal(KEY, {"t": "hello", "node": 2, "host": "stuck"}))
            nodes[0].publish({"index": 0, "ranks": [{"rank": 0, "blob": "x" * 200_000}]})
            for generation in range(60):  # 60 broadcasts it never reads, while node 1 keeps up
                nodes[0].start_generation(generation)
                nodes[0].report_failure(Failure("rank 0", 0, 1, 1, None, [], None))
                stuck.send_multipart(seal(KEY, {"t": "ask", "node": 2}))  # and 200 KB views it asks for
            assert until(lambda: nodes[1].first_failure(59))
        finally:
            stuck.close(linger=0)
            context.term()


def test_messages_with_another_key_or_a_node_out_of_range_are_dropped() -> None:
    port = free_port()
    with plane(3, node_timeout=1.0, port=port, started=2) as nodes:  # node 2 is the rogue socket (lost at the end)
        context = zmq.Context()
        rogue = context.socket(zmq.DEALER)
        secure_agent(rogue, curve_keys(KEY), 3)  # it holds the job's key (an insider): past the encryption
        rogue.connect(f"tcp://127.0.0.1:{port}")
        try:
            rogue.send_multipart(seal(b"x" * 32, {"t": "put", "node": 2, "topic": "t/1", "value": 1, "how": "count"}))
            rogue.send_multipart(seal(KEY, {"t": "end", "node": 7, "code": 3}))  # the job's key, but no such node
            rogue.send_multipart(seal(KEY, {"t": "hello", "node": 2}))  # the right key: answered
            answer = unseal(KEY, rogue.recv_multipart()) if rogue.poll(3000) else None
            assert answer is not None and answer["t"] == "welcome"
            assert until(lambda: nodes[0].hub.rejected == 2)
            assert nodes[0].gathered("t/1") == {} and nodes[1].ended is None
        finally:
            rogue.close(linger=0)
            context.term()
