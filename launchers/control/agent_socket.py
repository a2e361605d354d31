"""An agent's socket: opened to the hub, read and written by the driver's thread (``driver``).

The protocol is ``agent_core.AgentState``; these functions move its messages on a DEALER socket,
sealed, numbered and checked by ``wire`` and encrypted by ``transport``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import zmq

from launchers.control import messages as m
from launchers.control.agent_core import AgentState
from launchers.control.transport import MAX_IN, CurveKeys, secure_agent
from launchers.control.wire import seal, unseal
from launchers.log import say

MOVED_RETRY_MS = 250  # the longest wait between tries to reach a successor's hub (``succession``)


def dealer(context: zmq.Context[Any], address: str, state: AgentState, keys: CurveKeys | None) -> zmq.Socket[Any]:
    """The agent's socket, connected to ``address``: it queues nothing for a hub it is not connected to (a late hub
    gets no backlog).

    ``keys``: the job's CURVE keys (``transport``): only the job's hub can answer, encrypted."""
    sock = unconnected_dealer(context, state, keys)
    sock.connect(address)
    return sock


def unconnected_dealer(context: zmq.Context[Any], state: AgentState, keys: CurveKeys | None) -> zmq.Socket[Any]:
    """``dealer`` before its ``connect`` (``hub_probe`` watches the connection from its first event)."""
    sock = context.socket(zmq.DEALER)
    secure_agent(sock, keys, state.nnodes)
    sock.setsockopt(zmq.LINGER, 500)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.IDENTITY, f"node-{state.node}-{state.incarnation}".encode())
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    # a hub that is not there yet: back off to every 2 s; a successor's starts as its members find the old one
    # silent (within a timer's 0.2 s of each other), so one refused there is tried again every 0.25 s at most
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, MOVED_RETRY_MS if state.moving else 2000)
    return sock


def receive(sock: zmq.Socket[Any], state: AgentState, secret: bytes, now: float) -> None:
    """One message the hub said, to the state (a message that does not verify, or is malformed, is dropped).

    One per readiness: the poller is level-triggered, so a socket with more waiting is
    reported again at once; asking each socket whether more is there (``ZMQ_EVENTS``, or
    ending on ``zmq.Again``) cost more, for thousands of sockets, than the extra poll.
    """
    try:
        frame = sock.recv(zmq.NOBLOCK)  # the hub says one frame; a stray extra part fails its MAC on its own
    except zmq.Again:
        return
    wire_message = unseal(secret, [frame])
    if wire_message is not None and state.wire_in.fresh([frame]):
        with contextlib.suppress(KeyError, TypeError, ValueError):  # signed by the job's secret, but malformed
            message = m.decode(wire_message)
            if message is not None:
                state.on_message(message, now)


def flush(sock: zmq.Socket[Any], state: AgentState, secret: bytes, now: float) -> None:
    """Everything due, sealed and sent without blocking; what the socket does not take waits if it must arrive."""
    out = state.due(now)
    for index, message in enumerate(out):
        frames = seal(secret, message.to_wire(), state.wire_out)
        if len(frames[0]) > MAX_IN:  # the hub would cut the connection on it (``transport``): said, never sent
            say(f"control plane: node {state.node}'s {message.KIND!r} is {len(frames[0])} bytes, over the hub's "
                f"limit of {MAX_IN}: not sent")  # fmt: skip
            continue
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError:  # not connected (yet) or the hub's pipe is full
            state.unsent(out[index:])
            return
