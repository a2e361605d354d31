"""The probe ``discovery`` decides from: a signed ``hello`` to each target's control port, a verified ``welcome`` back.

One DEALER per target, made exactly as the agent's own (``agent_socket.dealer``: the job's CURVE
keys, the agent's identity, its stream of sealed messages), so only the job's hub can complete the
handshake, and only a hub holding the job's key answers the hello (it drops what does not verify).
The socket whose hub answered becomes the agent's (``Driver.adopt``): no second connection, and no
closed one that the hub would read as a member's mlaunch gone (its short fuse, ``Membership.on_close``).
The others are closed before any of them completed a handshake, or after one that failed.

Bounded: a port nothing listens on is known at the first refused connect (milliseconds: libzmq's
``CONNECT_RETRIED``); a target that has not even accepted the TCP connection after ``CONNECT_WAIT``
(a host that drops the SYN) is given up; one that accepted it gets ``ANSWER_WAIT`` for the
handshake and the welcome. At a fresh start every other port is closed, so the probe costs a few
milliseconds (measured: docs/elastic-membership.md).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Mapping
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from launchers.control import messages as m
from launchers.control.agent_core import AgentState
from launchers.control.agent_socket import receive, unconnected_dealer
from launchers.control.discovery import Answer
from launchers.control.transport import CurveKeys
from launchers.control.wire import seal

CONNECT_WAIT = 0.5  # seconds a target may take to accept the TCP connection (a refusal comes in milliseconds)
ANSWER_WAIT = 2.0  # seconds a target that accepted it may take to complete the handshake and answer the hello
POLL_MS = 20
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
WATCHED = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED | _FAILED


class Probe:
    """What each target said so far; the socket of the one whose hub answered."""

    def __init__(self, targets: Mapping[int, str]) -> None:
        self.answers = dict.fromkeys(targets, Answer.SILENT)
        self.connected: set[int] = set()
        self.hello_due: set[int] = set()  # handshake done, hello not taken by the socket yet
        self.found: int | None = None  # the target whose hub answered

    def pending(self, elapsed: float) -> bool:
        """Whether any target may still answer: connected ones within ``ANSWER_WAIT``, others ``CONNECT_WAIT``."""
        if self.found is not None:
            return False
        return any(
            not answer.decided() and elapsed < (ANSWER_WAIT if node in self.connected else CONNECT_WAIT)
            for node, answer in self.answers.items()
        )

    def on_event(self, node: int, event: int) -> None:
        """A socket monitor's event for ``node``'s connection."""
        if self.answers[node].decided():
            return
        if event == zmq.EVENT_CONNECTED:
            self.connected.add(node)
        elif event == zmq.EVENT_CONNECT_RETRIED and node not in self.connected:
            self.answers[node] = Answer.ABSENT  # refused, unreachable, or no such host: nothing listens
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.hello_due.add(node)
        elif event & _FAILED:
            self.answers[node] = Answer.STRANGER


def probe(
    context: zmq.Context[Any], keys: CurveKeys | None, secret: bytes, state: AgentState, targets: Mapping[int, str]
) -> tuple[dict[int, Answer], zmq.Socket[Any] | None]:
    """Each target's answer, and the connected socket of the hub that welcomed ``state`` (its state welcomed)."""
    found = Probe(targets)
    socks = {node: unconnected_dealer(context, state, keys) for node in targets}
    tag = secrets.token_hex(4)  # the probe's own monitor endpoints: the driver's monitor of the adopted socket
    # takes libzmq's default one (named after the socket) while this one may still be unbinding
    monitors = {n: sock.get_monitor_socket(WATCHED, f"inproc://mlaunch-probe-{tag}-{n}") for n, sock in socks.items()}
    for node, address in targets.items():
        try:
            socks[node].connect(address)
        except zmq.ZMQError:  # an address libzmq cannot even parse: no hub can be reached there
            found.answers[node] = Answer.ABSENT
    poller = zmq.Poller()
    owner: dict[zmq.Socket[Any], tuple[int, bool]] = {}  # socket → (its target, whether it is a monitor)
    for node in targets:
        poller.register(socks[node], zmq.POLLIN)
        poller.register(monitors[node], zmq.POLLIN)
        owner[socks[node]], owner[monitors[node]] = (node, False), (node, True)
    began = time.monotonic()
    try:
        while found.pending(time.monotonic() - began):
            for sock, _ in poller.poll(POLL_MS):
                node, monitor = owner[sock]
                if monitor:
                    found.on_event(node, int(parse_monitor_message(sock.recv_multipart())["event"]))
                    continue
                receive(sock, state, secret, time.monotonic())
                if state.welcomed or state.final is not None:  # its welcome, or that this node is out: the job's
                    found.answers[node], found.found = Answer.HUB, node
                    break
            for node in sorted(found.hello_due):
                if _hello(socks[node], state, secret):
                    found.hello_due.discard(node)
    finally:
        for node, sock in socks.items():
            poller.unregister(sock)
            poller.unregister(monitors[node])
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitors[node].close(linger=0)
            if node != found.found:
                sock.close(linger=0)
    return found.answers, socks[found.found] if found.found is not None else None


def _hello(sock: zmq.Socket[Any], state: AgentState, secret: bytes) -> bool:
    """The agent's hello, sealed in its own stream; False when the socket does not take it yet."""
    hello = m.Hello(state.node, state.host, state.incarnation, state.generation)
    try:
        sock.send_multipart(seal(secret, hello.to_wire(), state.wire_out), zmq.NOBLOCK)
    except zmq.ZMQError:
        return False
    return True
