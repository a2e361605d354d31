"""A node's agent on the control plane: a thread with a pyzmq DEALER socket joined to node 0's hub.

The protocol itself is ``agent_core.AgentState`` (what to say when, what the hub's words
mean); a ``driver.Driver`` thread owns the socket (its own, or one shared by many agents in
the benchmark); this module gives them the supervisor's interface (``JobEvents``). Other
threads hand in what to send through the state and kick the driver, so a report leaves at
once; the state wakes the supervisor's loop (a byte on ``wake_fd``) when something arrived.
Node 0 hosts the hub in the same process and reads it through the snapshot the hub thread
publishes (``Hub.snapshot``: who waits, what an exchange gathered, whether every node left,
every node's status entry), never through the hub's live state.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import zmq

from launchers.config.elastic import LAST_CALL
from launchers.control import discovery
from launchers.control import messages as m
from launchers.control.agent_core import AgentState
from launchers.control.driver import Driver
from launchers.control.events import (
    ExchangeFailed,
    HubMovedAway,
    JobEnded,
    JobEvent,
    JobEvents,
    LocalFailure,
    Lost,
    Meeting,
    RemoteFailure,
)
from launchers.control.hub import Hub
from launchers.control.hub_probe import probe
from launchers.control.reductions import BUILTIN, How, Reducers
from launchers.control.succession import Inherited
from launchers.log import say

CLOSE_WAIT = 10.0  # node 0 keeps the hub this long at most for the other nodes to leave
REPROBE_EVERY = 1.0  # seconds between probes of the other hosts while node 0's fresh hub waits for the first meeting
BYE_WAIT = 2.0  # seconds this node's driver may take to hand its bye to the socket


class NetworkEvents(JobEvents):
    def __init__(
        self,
        *,
        node: int,
        nnodes: int,
        master_addr: str,
        port: int,
        secret: bytes,
        node_timeout: float,
        join_timeout: float | None = None,
        driver: Driver | None = None,
        host: str = "",
        elastic: tuple[int, int] | None = None,
        reducers: Reducers = BUILTIN,
        last_call: float = LAST_CALL,
        hosts: Sequence[str] = (),
    ) -> None:
        """``driver``: a shared one (the benchmark's many agents in one process), else this node's own.

        ``elastic``: the job's node range (MIN, MAX): the hub leaves a lost node out and admits
        nodes that join instead of ending the job (``membership``), and its hub moves when node 0 is
        lost (``succession``: to the host of the next member, ``hosts``: the platform's host of each
        node index). ``reducers``: what the hub reduces exchanges with (``reductions.BUILTIN`` and
        the callers' own)."""
        super().__init__(reducers)
        self.node = node
        self.nnodes = nnodes
        self.secret = secret
        self.keyed_from_public_facts = False  # no MLAUNCH_JOB_SECRET nor key file (``open_job_events`` says so)
        self.hub: Hub | None = None
        self._own = driver is None
        if driver is None:
            driver = Driver(zmq.Context(), secret)
        self.driver = driver
        self.port, self.hosts, self.elastic = port, tuple(hosts), elastic
        self._hub_args = (node_timeout, reducers, last_call)
        self.movable = elastic is not None and len(self.hosts) >= nnodes and all(self.hosts)
        self._handed_over = False  # this node hosted the hub and left gracefully: the others moved on
        self._wake_r, self._wake_w = _pipe() if self._own else (-1, -1)  # the supervisor's loop: something arrived
        self.wake_fd: int | None = self._wake_r if self._own else None
        self._state_args = (node, nnodes, node_timeout, join_timeout or 0.0, host or socket.gethostname())
        self.state = self._new_state()
        self._found: tuple[AgentState, zmq.Socket[Any], str] | None = None  # a moved hub node 0 found (``meet``)
        place = self._place(master_addr)
        if self._own:
            driver.start()
            if place.said:
                say(place.said)
            if place.join is None:
                say(
                    f"control plane: node {node} of {nnodes} joining {master_addr}:{port}"
                    + (" (hosting it)" if place.host else "")
                )

    def _new_state(self) -> AgentState:
        return AgentState(
            *self._state_args, wake=self._wake, elastic=self.elastic, hosts=self.hosts,
            mover=self._move_hub if self._own else None,
        )  # fmt: skip

    def _targets(self) -> dict[int, str]:
        return {n: f"tcp://{self.hosts[n]}:{self.port}" for n in discovery.targets(self.node, self.movable, self.hosts)}

    def _place(self, master_addr: str) -> discovery.Place:
        """Where this node's agent joins the hub (``discovery``), applied here: the one place that starts node 0's hub.
        An elastic job whose platform names every host probes the other hosts first: a hub that moved while this
        mlaunch was away answers, and the agent joins it (a returning node, a candidate)."""
        node, driver = self.node, self.driver
        targets = self._targets()
        answers, sock = probe(driver.context, driver.keys, self.secret, self.state, targets) if targets else ({}, None)
        place = discovery.decide(node, answers, self.state.hub if sock is not None else None)
        if place.host:
            self._start_hub(movable=self.movable)
        if sock is not None and place.join is not None:
            driver.adopt(self.state, sock)
        else:
            driver.add(self.state, f"tcp://{'127.0.0.1' if place.host else master_addr}:{self.port}")
        return place

    def _move_hub(self, node: int, inherited: Inherited) -> str | None:
        """The hub moves to ``node`` (the driver's thread): started here when it is this node; its address.

        None when the platform named no host of every node (no host list): the members could not all find
        the new hub, so it does not move (the job ends, as before)."""
        if not self.movable:
            return None
        if node == self.node:
            if self.hub is None:
                self._start_hub(host_node=node, inherited=inherited, movable=True)
                say(f"control plane: node {node} hosts the hub now, for nodes {', '.join(map(str, inherited.members))}"
                    f" without {', '.join(map(str, inherited.gone))}")  # fmt: skip
            return f"tcp://127.0.0.1:{self.port}"
        return f"tcp://{self.hosts[node]}:{self.port}"

    def _start_hub(self, **where: Any) -> None:
        """This node's hub, started; its own agent never judges a hub in this process lost while its thread lives
        (a loaded machine starves it: CI's 128 mlaunch on 2 cores once ended a job that way)."""
        timeout, reducers, last_call = self._hub_args
        self.hub = Hub(
            self.driver.context, self.port, self.secret, self.nnodes, timeout, self.elastic, reducers, last_call,
            **where,
        )  # fmt: skip
        self.hub.start()
        self.state.hub_here = self.hub.is_alive

    @property
    def hosting(self) -> bool:
        """This node's mlaunch runs the job's hub (node 0, or its successor)."""
        return self.hub is not None

    # -- the supervisor's and the runner's side ------------------------------------------------
    @property
    def networked(self) -> bool:
        return True

    @property
    def lost(self) -> Lost | None:
        return self.state.lost

    @property
    def ended(self) -> JobEnded | None:
        return self.state.ended

    @property
    def status_every(self) -> float:
        return self.state.cadence.status

    def start_generation(self, generation: int) -> None:
        super().start_generation(generation)
        with self.state.cond:
            self.state.generation = generation

    def report_failure(self, failure: LocalFailure) -> None:
        # The hub decides which failure was the job's first; it tells every node, this one too.
        self.state.report_failure(failure)
        self._kick()

    def poll(self) -> JobEvent | None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass
        state = self.state
        with state.cond:
            for index, event in enumerate(state.events):
                if isinstance(event, RemoteFailure) and 0 <= event.generation != self.generation:
                    continue  # another attempt's: an old one is over, a newer one is for later
                return state.events.pop(index)
            state.events[:] = [  # an attempt that ended (through the MPI completion channel, say) left it behind
                e for e in state.events if not (isinstance(e, RemoteFailure) and e.generation < self.generation)
            ]
            return None

    def first_failure(self, generation: int, wait: float = 0.0) -> RemoteFailure | None:
        end = time.monotonic() + wait
        state = self.state
        with state.cond:
            while generation not in state.first and state.lost is None and time.monotonic() < end:
                state.cond.wait(max(0.0, end - time.monotonic()))
            first = state.first.get(generation)
        return first.event() if first is not None else None

    def reduce(self, topic: str, value: Any, deadline: float, how: How) -> Any:
        self.state.contribute(topic, value, how)
        self._kick()
        return self.state.result(topic, deadline)

    def gathered(self, topic: str) -> dict[int, Any]:
        return self.hub.partial(topic) if self.hub is not None else {}

    def publish(self, entry: dict[str, Any]) -> None:
        self.state.publish(entry)
        self._kick()

    def view(self) -> dict[int, dict[str, Any]]:
        if self.hub is not None:
            return {**self.hub.view(), **self.state.seen_view(time.monotonic())}
        return self.state.seen_view(time.monotonic())

    def view_stamp(self) -> float:
        return self.state.status.view_at

    def request_view(self) -> None:
        if self.hub is not None:
            return  # node 0 holds every entry
        self.state.ask_view(time.monotonic())
        self._kick()

    def publish_summary(self, summary: dict[str, Any]) -> None:
        if self.hub is not None:
            self.state.send(m.Summary(self.node, summary))
            self._kick()

    def wire_stats(self) -> dict[str, Any] | None:
        if self.hub is None:
            return None
        return {**self.hub.wire_stats(), "keyed_from_public_facts": self.keyed_from_public_facts}

    def summary(self) -> dict[str, Any]:
        with self.state.cond:
            return dict(self.state.status.summary)

    def close(self, exit_code: int) -> None:
        self.state.flush_status()
        if self.hub is not None and not self._handed_over:  # the job's last word: peers that follow the hub's node
            self.state.send(m.End(self.node, exit_code))  # exit with it (handed over: the job goes on without it)
        self.state.send(m.Bye(self.node, exit_code))
        self._kick()
        if self.hub is not None:
            if not self._handed_over:  # handed over: the others left for the next hub already
                self.hub.wait_everyone_left(CLOSE_WAIT)
            self.hub.stop()
        said = self.driver.remove(self.state)  # sends what is due (the bye) and closes the socket
        if not self._own:
            return
        said.wait(BYE_WAIT)  # handed to the socket: ``term`` below waits for it to leave (the socket's linger)
        self.driver.stop()
        self.wake_fd = None
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.driver.context.term()

    # -- an elastic job's membership -------------------------------------------------------------
    @property
    def candidate(self) -> bool:
        return self.state.candidate

    def joined(self, deadline: float) -> bool:
        state = self.state
        with state.cond:
            while not state.welcomed and state.lost is None and time.monotonic() < deadline:
                state.cond.wait(max(0.0, min(1.0, deadline - time.monotonic())))
            return state.welcomed and state.lost is None

    def meet(self, key: str, generation: int, restarts: int, deadline: float, *, admit: bool = True) -> Meeting:
        """The meeting ``key``; node 0's fresh hub also looks for a moved one meanwhile (``HubMovedAway``)."""
        state = self.state
        state.meet(key, generation, restarts, admit)
        self._kick()
        search = generation == 0 and self.hub is not None and self.movable and bool(self._targets())
        done = threading.Event()
        if search:  # in a thread of its own: a probe of a silent host must not hold back the meeting's answer
            threading.Thread(
                target=self._search_moved_hub, args=(state, done), name="mlaunch-reprobe", daemon=True
            ).start()
        try:
            with state.cond:
                while key not in state.meetings:
                    if state.final is not None:
                        raise ExchangeFailed(state.final.describe())
                    if self._found is not None:
                        raise HubMovedAway(self._found[2])
                    now = time.monotonic()
                    if now >= deadline:
                        raise ExchangeFailed("not every node came to the meeting in time")
                    state.cond.wait(deadline - now)
                if self._found is not None:  # found as the meeting was answered: the meeting stands
                    self._found[1].close(linger=0)
                    self._found = None
                return state.meetings[key]
        finally:
            with state.cond:
                done.set()

    def _search_moved_hub(self, state: AgentState, done: threading.Event) -> None:
        """Node 0 started again at once hosts a fresh hub before the others moved theirs away from its host:
        nobody answered its first probe, the others move the hub to the lowest of them and train on, and this
        hub would wait for a first meeting nobody comes to (a netns run: 100 s, then failed). The other hosts
        are probed each ``REPROBE_EVERY`` while the meeting waits; a hub that answers is the job's, and
        ``HubMovedAway`` sends this node there as a returning one. Beside ``meet``'s wait (a probe: 0.5-2 s)."""
        while not done.wait(REPROBE_EVERY):
            fresh = self._new_state()
            answers, sock = probe(self.driver.context, self.driver.keys, self.secret, fresh, self._targets())
            if sock is None:
                continue
            place = discovery.decide(self.node, answers, fresh.hub)
            with state.cond:
                if place.join is None or done.is_set():  # no hub of this job, or the meeting was answered
                    sock.close(linger=0)
                    continue  # done: the loop's wait ends at once
                self._found = (fresh, sock, place.said)
                state.cond.notify_all()
                return

    def join_moved_hub(self) -> bool:
        if self._found is None:
            return False
        fresh, sock, said = self._found
        self._found = None
        self.driver.remove(self.state)
        if self.hub is not None:
            self.hub.stop()
            self.hub = None
        self.state = fresh
        self.driver.adopt(fresh, sock)
        say(said)
        return True

    def admission(self, wait: float) -> Meeting | None:
        state = self.state
        end = time.monotonic() + wait
        with state.cond:
            while state.admitted is None and state.final is None and time.monotonic() < end:
                state.cond.wait(max(0.0, end - time.monotonic()))
            return state.admitted

    def waiting(self) -> list[int]:
        return list(self.hub.snapshot().waiting) if self.hub is not None else []

    def ready_to_join(self) -> list[int]:
        if self.hub is None:
            return []
        view = self.hub.snapshot()
        return [node for node in view.waiting if node in view.ready]

    def ready(self) -> None:
        self.state.send(m.Ready(self.node))
        self._kick()

    def leave(self, why: str) -> None:
        """Said to the hub; the hub's own node too when the hub can move (it hands over), else its stop ends the job."""
        if self.hub is None or self.movable:
            self._handed_over = self.hub is not None
            self.state.send(m.Leaving(self.node, why))
            self._kick()

    def regroup(self, why: str) -> None:
        if self.hub is not None:
            self.state.send(m.Regroup(self.node, why))
            self._kick()

    def _kick(self) -> None:
        self.driver.kick(self.state)

    def _wake(self) -> None:
        if self._own:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"!")


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    return read_fd, write_fd
