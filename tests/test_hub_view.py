"""Node 0's other threads read the hub while its thread changes it: they see whole snapshots, never a torn one.

The hub thread owns the hub's state and publishes an immutable ``HubView``; node 0's main thread
asks who waits to join (``waiting``), what an unfinished exchange gathered (``gathered`` /
``partial``), whether every node left and the status view. Before, those reads iterated the hub
thread's live dicts ("dictionary changed size during iteration", a node both a member and a
candidate). Here one thread reads in a tight loop while 64 real agents (real sockets, one shared
driver thread) join, publish, contribute, say bye, come back, vanish and are left out or lost.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from launchers.control import ExchangeFailed
from launchers.platform.cluster import free_port

zmq = pytest.importorskip("zmq")

KEY = b"v" * 32
NNODES = 64
SPAN = (50, 64)  # elastic: members leave and join; below 50 (candidates counted) a departure is a loss


def until(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    return check()


class Hammer(threading.Thread):
    """Reads everything node 0's main thread reads of its hub, as fast as it can, checking each view is whole."""

    def __init__(self, node0: Any) -> None:
        super().__init__(name="hammer", daemon=True)
        self.node0, self.halt = node0, threading.Event()
        self.errors: list[BaseException] = []
        self.reads = 0
        self.most_waiting = 0

    def run(self) -> None:
        node0, hub = self.node0, self.node0.hub
        while not self.halt.is_set():
            try:
                waiting, gathered, _, status = node0.waiting(), node0.gathered("x/1"), hub.everyone_left(), node0.view()
                view = hub.snapshot()
                assert waiting == sorted(waiting) and all(isinstance(v, int) for v in gathered)
                assert all(isinstance(n, int) for n in status) and isinstance(hub.partial("x/1"), dict)
                assert view.lost <= view.gathered("x/1").keys()  # a lost node's part is None: none will come
                assert view.members.isdisjoint(view.waiting) and view.members.isdisjoint(view.left_out)
                assert view.lost <= view.members and view.said_bye <= view.members
                self.most_waiting = max(self.most_waiting, len(view.waiting))
                self.reads += 1
                time.sleep(0.0002)  # give the GIL back: a reader that never yields starves the threads it watches
            except BaseException as exc:  # noqa: BLE001 - any error is the finding
                self.errors.append(exc)
                return


def test_node_0_reads_whole_views_while_64_agents_join_leave_and_are_lost() -> None:
    from launchers.control.agent import NetworkEvents
    from launchers.control.driver import Driver

    port = free_port()

    def agent(node: int, driver: Any = None) -> Any:
        return NetworkEvents(
            node=node, nnodes=NNODES, master_addr="127.0.0.1", port=port, secret=KEY, node_timeout=4.0,
            driver=driver, host=f"h{node}", elastic=SPAN,
        )  # fmt: skip

    node0 = agent(0)
    driver = Driver(zmq.Context(), KEY)
    driver.start()
    hammer = Hammer(node0)
    hammer.start()
    agents = {n: agent(n, driver) for n in range(1, NNODES)}
    back: list[Any] = []
    try:
        assert until(lambda: all(a.state.welcomed for a in agents.values()))
        for node, events in agents.items():
            events.publish({"index": node, "ranks": [{"rank": node, "step": 1}]})
            events.state.contribute("x/1", node, "count")  # never finished: node 0 does not contribute
            driver.kick(events.state)
        assert until(lambda: len(node0.gathered("x/1")) == NNODES - 1 and len(node0.view()) >= NNODES - 1)
        for node in range(1, 9):  # ended with a failure: left out (the open exchange is void)
            agents.pop(node).close(1)
        for node in range(9, 17):  # ended well: said bye, still one of the job's nodes
            agents.pop(node).close(0)
        assert until(lambda: len(node0.hub.snapshot().left_out) == 8 and len(node0.hub.snapshot().said_bye) == 8)
        back = [agent(node, driver) for node in range(1, 9)]  # their mlaunch started again: candidates
        assert until(lambda: node0.waiting() == list(range(1, 9)))
        for node in range(17, 41):  # 24 vanish: 14 are left out (candidates count to MIN), then 10 are lost
            driver.remove(agents.pop(node).state)
        assert until(lambda: len(node0.hub.snapshot().lost) == 10 and len(node0.hub.snapshot().left_out) == 14)
        with pytest.raises(ExchangeFailed, match="left the job"):
            agents[41].state.result("x/1", time.monotonic() + 5)  # voided by the first departure
    finally:
        hammer.halt.set()
        hammer.join(10)
        for events in [*agents.values(), *back]:
            events.close(0)
        node0.close(0)
        driver.stop()
        driver.context.term()
    assert not hammer.errors, repr(hammer.errors[0])
    assert hammer.reads > 100 and hammer.most_waiting == 8
