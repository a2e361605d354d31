"""The thread that drives agents' sockets: one agent for a node's mlaunch, thousands for the benchmark.

Each agent is an ``AgentState`` (the protocol) with its own DEALER socket to the hub; the
driver polls every socket and a wake-up pipe in one poller, hands what arrived to the
agent's state, and sends what the state says is due (a report handed in by another thread
leaves at once: ``kick``). Only this thread touches the sockets. ``NetworkEvents`` starts a
driver of its own; ``benchmarks/control_scale.py`` puts many agents on one driver per process,
so it measures the very code a node runs.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections import deque
from typing import Any

import zmq

from launchers.control.agent_core import AgentState
from launchers.control.agent_socket import dealer, flush, receive
from launchers.control.transport import curve_keys

WATCHED = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED  # a closed connection; one up (say what is due)
_EVENT = struct.Struct("=HI")  # libzmq's monitor frame: the event (u16), then its value
TIMERS = 0.2  # seconds between looks at every agent's timers (heartbeat, status, hello retry, the hub's silence)


class Driver(threading.Thread):
    def __init__(self, context: zmq.Context[Any], secret: bytes, name: str = "mlaunch-control") -> None:
        super().__init__(name=name, daemon=True)
        self.context = context
        self.secret = secret
        self.keys = curve_keys(secret)  # derived once: a benchmark's driver opens thousands of sockets
        self._kick_r, self._kick_w = os.pipe()
        for fd in (self._kick_r, self._kick_w):
            os.set_blocking(fd, False)
        self._changes: deque[tuple[AgentState, str | zmq.Socket[Any] | threading.Event]] = deque()  # adds; removes
        self._dirty: deque[AgentState] = deque()  # agents with something to send now
        self._halt = threading.Event()

    def add(self, state: AgentState, address: str) -> None:
        self._changes.append((state, address))
        self.kick()

    def adopt(self, state: AgentState, sock: zmq.Socket[Any]) -> None:
        """Drive ``state`` on ``sock``, a socket already connected to its hub (``hub_probe``: the one that answered)."""
        self._changes.append((state, sock))
        self.kick()

    def remove(self, state: AgentState) -> threading.Event:
        """Stop driving ``state`` and close its socket; the event is set once what it still had to say (its
        ``bye``) was handed to the socket and the socket closed (``Context.term`` then waits for it to leave)."""
        done = threading.Event()
        self._changes.append((state, done))
        self.kick()
        return done

    def kick(self, state: AgentState | None = None) -> None:
        """Wake the thread: ``state`` has something to send now (None: look at every agent)."""
        if state is not None:
            self._dirty.append(state)
        with contextlib.suppress(OSError):
            os.write(self._kick_w, b"!")

    def stop(self) -> None:
        self._halt.set()
        self.kick()
        self.join(timeout=2)
        for fd in (self._kick_r, self._kick_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._kick_r, zmq.POLLIN)
        agents: dict[zmq.Socket[Any], AgentState] = {}
        sockets: dict[int, zmq.Socket[Any]] = {}  # id(state) → its socket
        monitors: dict[zmq.Socket[Any], AgentState] = {}  # each socket's closed connections (``on_hub_closed``)
        monitor_of: dict[int, zmq.Socket[Any]] = {}  # id(state) → its socket's monitor
        next_timers = 0.0
        try:
            while not self._halt.is_set():
                ready = poller.poll(int(TIMERS * 1000))
                now = time.monotonic()
                self._drain_kicks()
                self._apply_changes(poller, agents, sockets, (monitors, monitor_of), now)
                for sock, _ in ready:
                    state = agents.get(sock) if isinstance(sock, zmq.Socket) else None
                    if state is not None:
                        receive(sock, state, self.secret, now)
                    elif isinstance(sock, zmq.Socket) and sock in monitors and watch(sock, monitors[sock], now):
                        self._dirty.append(monitors[sock])  # connected: its hello (what is due) leaves now
                while self._dirty:  # a report handed in: it leaves now, not at the next timer
                    state = self._dirty.popleft()
                    if id(state) in sockets:
                        flush(sockets[id(state)], state, self.secret, now)
                if now >= next_timers:
                    next_timers = now + TIMERS
                    for sock, state in agents.items():
                        flush(sock, state, self.secret, now)
                        state.check(now)
                        address = state.take_move()
                        if address is not None:  # the hub moved (``succession``): a new socket joins it
                            self._changes.append((state, threading.Event()))
                            self._changes.append((state, address))
                            self.kick()  # now, not after the next poll's 0.2 s
        finally:
            # a remove handed in as it stopped
            self._apply_changes(poller, agents, sockets, (monitors, monitor_of), time.monotonic())
            for monitor in list(monitors):
                monitor.close(linger=0)
            for sock in agents:
                sock.close()

    def _drain_kicks(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._kick_r, 4096):
                pass

    def _apply_changes(
        self,
        poller: zmq.Poller,
        agents: dict[zmq.Socket[Any], AgentState],
        sockets: dict[int, zmq.Socket[Any]],
        watched: tuple[dict[zmq.Socket[Any], AgentState], dict[int, zmq.Socket[Any]]],
        now: float,
    ) -> None:
        monitors, monitor_of = watched
        while self._changes:
            state, change = self._changes.popleft()
            if isinstance(change, (str, zmq.Socket)):
                sock = dealer(self.context, change, state, self.keys) if isinstance(change, str) else change
                sockets[id(state)] = sock
                agents[sock] = state
                poller.register(sock, zmq.POLLIN)
                monitor = monitor_of[id(state)] = sock.get_monitor_socket(WATCHED)
                monitors[monitor] = state
                poller.register(monitor, zmq.POLLIN)
                flush(sock, state, self.secret, now)  # hello at once
                continue
            if id(state) in sockets:
                gone = sockets.pop(id(state))
                if not state.moving:  # a stop's last words; a move's wait for the new hub (a hello here: its welcome)
                    flush(gone, state, self.secret, now)
                poller.unregister(gone)
                if id(state) in monitor_of:
                    watcher = monitor_of.pop(id(state))
                    poller.unregister(watcher)
                    stop_monitor(gone, watcher, monitors)
                del agents[gone]
                gone.close()
            change.set()


def watch(monitor: zmq.Socket[Any], state: AgentState, now: float) -> bool:
    """The monitor's events: a closed connection to the hub told to the agent (once per event read); True when
    a connection came up (its handshake done: the socket takes messages now, ``IMMEDIATE``)."""
    up = False
    while True:
        try:
            kind, _ = _EVENT.unpack_from(monitor.recv_multipart(zmq.NOBLOCK)[0])
        except zmq.Again:
            return up
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            up = True
        else:
            state.on_hub_closed(now)


def stop_monitor(sock: zmq.Socket[Any], monitor: zmq.Socket[Any], monitors: dict[zmq.Socket[Any], AgentState]) -> None:
    """Stop ``sock``'s monitor and close it, before the socket itself closes."""
    with contextlib.suppress(zmq.ZMQError):
        sock.disable_monitor()
    monitor.close(linger=0)
    del monitors[monitor]
