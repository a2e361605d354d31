"""The rank's watcher answers mlaunch's ``hold`` only for the attempt the process is still in.

``@elastic.recoverable`` runs a thread beside the training that, on a ``hold``, shuts down the TCP
connections the current call opened, so that every survivor's wait ends at once. Found in the 2-host
benchmark (1 recovery in about 300): a watcher that had read a hold of attempt N, then lost the CPU while
its main thread already joined attempt N+1, shut down N+1's fresh store and gloo connections. The rank
failed with "Broken pipe", or a handshake never completed and the whole re-formed group waited in
``init_process_group`` until ``monitor.rejoin_timeout`` restarted the job whole.

Real threads and real loopback connections (nothing mocked): what a user relies on is that a hold left
behind never touches the next call's connections, and that a hold of the current attempt still ends its
waits.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest

from launchers.elastic import in_place
from launchers.elastic.ipc import recovery
from launchers.elastic.ranks.env import ATTEMPT_ENV


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(64)
    yield server
    server.close()


@pytest.fixture(autouse=True)
def attempt_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ATTEMPT_ENV, "0")
    monkeypatch.setattr(in_place._Watcher, "_acted_on", -1)


def connection(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(listener.getsockname())
    served, _ = listener.accept()
    return client, served


def alive(client: socket.socket, served: socket.socket) -> bool:
    try:
        client.sendall(b"x")
        served.settimeout(5)
        return served.recv(1) == b"x"
    except OSError:
        return False


def go_word(attempt: int) -> recovery.Word:
    return recovery.Word(recovery.GO, attempt, {ATTEMPT_ENV: str(attempt)})


def test_a_hold_of_the_current_attempt_ends_the_calls_waits(listener: socket.socket) -> None:
    in_place._Watcher.call_started(in_place._socket_inodes())
    client, served = connection(listener)
    try:
        assert in_place._Watcher.answer(recovery.Word(recovery.HOLD, 0)) >= 1
        assert not alive(client, served)
        assert in_place._Watcher.answer(recovery.Word(recovery.HOLD, 0)) == 0  # answered once per attempt
    finally:
        client.close()
        served.close()


def test_a_go_seen_without_its_hold_still_ends_the_calls_waits(listener: socket.socket) -> None:
    """mlaunch writes ``go`` some 20 ms after ``hold``; a watcher that missed the hold sees only the go. Its
    main thread, blocked in the old attempt's collective, must still be freed (found: a survivor left waiting in
    the step's agreement while the others formed the next group, until ``monitor.rejoin_timeout``)."""
    in_place._Watcher.call_started(in_place._socket_inodes())
    client, served = connection(listener)
    try:
        assert in_place._Watcher.answer(go_word(1)) >= 1  # a go to attempt 1 while this process is in attempt 0
        assert not alive(client, served)
    finally:
        client.close()
        served.close()
    in_place._enter(go_word(1))  # the main thread joins attempt 1: that go is now about its own attempt
    in_place._Watcher.call_started(in_place._socket_inodes())
    client, served = connection(listener)
    try:
        assert in_place._Watcher.answer(go_word(1)) == 0
        assert alive(client, served)
    finally:
        client.close()
        served.close()


def test_a_hold_left_behind_never_touches_the_next_calls_connections(listener: socket.socket) -> None:
    """The main thread moves on while the watcher answers the last attempt's hold, many times over: the
    connections the next call opens must all live. (Without the lock this failed within a few hundred rounds.)"""
    broken = []
    for attempt in range(400):
        in_place._Watcher.call_started(in_place._socket_inodes())
        old = connection(listener)  # the call of ``attempt``: its failed collective's connection
        watcher = threading.Thread(target=in_place._Watcher.answer, args=(recovery.Word(recovery.HOLD, attempt),))
        watcher.start()
        in_place._enter(go_word(attempt + 1))  # the main thread's move to the next attempt, as ``_rejoin`` makes it
        in_place._Watcher.call_started(in_place._socket_inodes())
        new = connection(listener)  # the next call's store or gloo connection
        watcher.join()
        if not alive(*new):
            broken.append(attempt)
        for sock in (*old, *new):
            sock.close()
    assert broken == [], f"the next call's connection was shut down after {len(broken)} of 400 holds"
    assert os.environ[ATTEMPT_ENV] == "400"
