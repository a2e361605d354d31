"""A node's agent on the control plane: a thread with a pyzmq DEALER socket joined to node 0's hub.

The thread heartbeats, receives what the hub relays and wakes the supervisor's loop (a
byte on ``wake_fd``). Only that thread touches the DEALER socket: the supervisor's thread
hands it what to send through an in-process PUSH/PULL pair, so a report leaves at once.
The hub is lost to an agent that hears nothing from it for ``node_timeout`` — or, before it
first answered, for ``join_timeout`` (the nodes of a job start at different times).
Node 0's agent says the job's exit code on the plane when it closes (``JobEnded``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from typing import Any

import zmq

from launchers.control.events import (
    ExchangeFailed,
    JobEnded,
    JobEvent,
    JobEvents,
    LocalFailure,
    Lost,
    RemoteFailure,
)
from launchers.control.hub import HEARTBEAT, Hub
from launchers.control.wire import seal, unseal
from launchers.log import say

CLOSE_WAIT = 10.0  # node 0 keeps the hub this long at most for the other nodes to leave


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
    ) -> None:
        super().__init__()
        self.node = node
        self.nnodes = nnodes
        self.secret = secret
        self.node_timeout = node_timeout
        self.join_timeout = max(node_timeout, join_timeout or 0.0)
        self.host = socket.gethostname()
        self.context: zmq.Context[Any] = zmq.Context()
        self.hub: Hub | None = None
        if node == 0:
            self.hub = Hub(self.context, port, secret, nnodes, node_timeout)
            self.hub.start()
        self._inbox = f"inproc://mlaunch-agent-{secrets.token_hex(4)}"
        self._push = self.context.socket(zmq.PUSH)
        self._push.bind(self._inbox)
        read_fd, self._wake_w = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(self._wake_w, False)
        self.wake_fd: int | None = read_fd
        self._wake_r = read_fd
        self._cond = threading.Condition()
        self._events: list[JobEvent] = []
        self._results: dict[str, dict[int, Any]] = {}
        self._lost: Lost | None = None
        self._ended: JobEnded | None = None
        self._hub_closing = False
        self._halt = threading.Event()
        address = f"tcp://{'127.0.0.1' if node == 0 else master_addr}:{port}"
        self._thread = threading.Thread(target=self._run, args=(address,), name="mlaunch-control", daemon=True)
        self._thread.start()
        self._send({"t": "hello", "host": self.host})
        say(
            f"control plane: node {node} of {nnodes} joined {master_addr}:{port}"
            + (" (hosting it)" if node == 0 else "")
        )

    # -- the supervisor's and the runner's side ------------------------------------------------
    @property
    def networked(self) -> bool:
        return True

    @property
    def lost(self) -> Lost | None:
        return self._lost

    @property
    def ended(self) -> JobEnded | None:
        return self._ended

    def report_failure(self, failure: LocalFailure) -> None:
        # The hub decides which failure was the job's first; it tells every node, this one too.
        self._send({"t": "fail", "gen": self.generation, **_failure_fields(failure)})

    def poll(self) -> JobEvent | None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass
        with self._cond:
            for index, event in enumerate(self._events):
                if isinstance(event, RemoteFailure) and 0 <= event.generation != self.generation:
                    continue  # another attempt's: an old one is over, a newer one is for later
                return self._events.pop(index)
            self._events = [  # an attempt that ended (through the MPI completion channel, say) left it behind
                e for e in self._events if not (isinstance(e, RemoteFailure) and e.generation < self.generation)
            ]
            return None

    def first_failure(self, generation: int, wait: float = 0.0) -> RemoteFailure | None:
        end = time.monotonic() + wait
        with self._cond:
            while generation not in self._first and self._lost is None and time.monotonic() < end:
                self._cond.wait(max(0.0, end - time.monotonic()))
            return self._first.get(generation)

    def exchange(self, topic: str, value: Any, deadline: float) -> dict[int, Any]:
        self._send({"t": "put", "topic": topic, "value": value})
        with self._cond:
            while topic not in self._results:
                if self._lost is not None:
                    raise ExchangeFailed(self._lost.describe())
                if self._ended is not None:
                    raise ExchangeFailed(self._ended.describe())
                if time.monotonic() >= deadline:
                    raise ExchangeFailed(f"not every node answered {topic.split('/')[0]!r} in time")
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return self._results[topic]

    def publish(self, entry: dict[str, Any]) -> None:
        with self._cond:
            self._view[self.node] = entry
        self._send({"t": "st", "entry": entry})

    def view(self) -> dict[int, dict[str, Any]]:
        with self._cond:
            return dict(self._view)

    def close(self, exit_code: int) -> None:
        with contextlib.suppress(zmq.ZMQError):
            if self.node == 0:  # the job's last word: peers that follow node 0 exit with it
                self._send({"t": "end", "code": exit_code, "host": self.host})
            self._send({"t": "bye", "code": exit_code})
        if self.hub is not None:
            end = time.monotonic() + CLOSE_WAIT
            while not self.hub.everyone_left() and time.monotonic() < end:
                time.sleep(0.05)
            self.hub.stop()
        time.sleep(0.05)  # let the bye leave
        self._halt.set()
        self._thread.join(timeout=2)
        self._push.close(linger=0)
        self.wake_fd = None
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.context.term()

    def _send(self, message: dict[str, Any]) -> None:
        self._push.send_json({**message, "node": self.node})

    # -- the agent thread ---------------------------------------------------------------------
    def _run(self, address: str) -> None:
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 500)
        dealer.setsockopt(zmq.IDENTITY, f"node-{self.node}-{secrets.token_hex(4)}".encode())
        dealer.connect(address)
        pull = self.context.socket(zmq.PULL)
        pull.connect(self._inbox)
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(pull, zmq.POLLIN)
        heard = next_beat = time.monotonic()
        joined = False
        try:
            while not self._halt.is_set():
                ready = dict(poller.poll(50))
                while pull in ready and pull.poll(0):
                    with contextlib.suppress(zmq.Again):
                        dealer.send_multipart(seal(self.secret, pull.recv_json()), zmq.NOBLOCK)
                while dealer in ready and dealer.poll(0):
                    message = unseal(self.secret, dealer.recv_multipart())
                    if message is not None:
                        heard, joined = time.monotonic(), True
                        self._on_message(message)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + HEARTBEAT
                    with contextlib.suppress(zmq.Again):
                        dealer.send_multipart(seal(self.secret, {"t": "hb", "node": self.node}), zmq.NOBLOCK)
                silent = now - heard
                if silent > (self.node_timeout if joined else self.join_timeout) and self._quiet_is_loss():
                    what = "the master, hosting the control plane" + (
                        "" if joined else "; it never answered: not started, unreachable, or another job secret"
                    )
                    self._final(Lost(0, what, silent))
        finally:
            dealer.close()
            pull.close(linger=0)

    def _quiet_is_loss(self) -> bool:
        """Silence from a hub that said it closes, or after node 0 ended the job, is no loss."""
        return not self._hub_closing and self._lost is None and self._ended is None

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message["t"]
        if kind == "fail":
            failure = RemoteFailure(
                int(message["node"]),
                int(message["rank"]),
                str(message["label"]),
                int(message["code"]),
                message.get("signal"),
                str(message.get("host", "")),
                str(message.get("cause") or ""),
                int(message["gen"]),
            )
            with self._cond:
                self._first[int(message["gen"])] = failure
                if failure.node != self.node:
                    self._events.append(failure)
                self._cond.notify_all()
            self._wake()
        elif kind == "got":
            with self._cond:
                self._results[str(message["topic"])] = {int(k): v for k, v in message["values"].items()}
                self._cond.notify_all()
        elif kind == "lost":
            self._final(Lost(int(message["lost"]), str(message.get("host", "")), float(message["seconds"])))
        elif kind == "closing":
            self._hub_closing = True
        elif kind == "end" and int(message["node"]) != self.node:
            self._final(JobEnded(int(message["node"]), int(message["code"]), str(message.get("host", ""))))
        elif kind == "view" and isinstance(message.get("nodes"), dict):
            with self._cond:
                for node, entry in message["nodes"].items():
                    if str(node).isascii() and str(node).isdigit() and int(node) != self.node:
                        self._view[int(node)] = entry

    def _final(self, event: Lost | JobEnded) -> None:
        """A lost node or the job's end: the first of its kind is kept and queued, later ones are not."""
        attr = "_lost" if isinstance(event, Lost) else "_ended"
        with self._cond:
            if getattr(self, attr) is None:
                setattr(self, attr, event)
                self._events.append(event)
            self._cond.notify_all()
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")


def _failure_fields(failure: LocalFailure) -> dict[str, Any]:
    return {
        "rank": failure.rank,
        "label": failure.label,
        "code": failure.exit_code,
        "signal": failure.signal,
        "cause": failure.cause,
    }
