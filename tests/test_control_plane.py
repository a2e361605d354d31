"""The control plane on loopback (two agents in this process) and the per-rank env/error file; fast."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from launchers.plan import ProcessSpec
from launchers.platform.cluster import free_port
from launchers.run.control import ExchangeFailed, LocalEvents, Lost, RemoteFailure
from launchers.run.control.wire import job_secret, seal, unseal
from launchers.run.outcome import Failure
from launchers.run.rank_env import error_file_lines

zmq = pytest.importorskip("zmq")


def agents(node_timeout: float = 5.0) -> list[Any]:
    from launchers.run.control.agent import NetworkEvents

    port = free_port()
    return [
        NetworkEvents(
            node=node, nnodes=2, master_addr="127.0.0.1", port=port, secret=b"k" * 32, node_timeout=node_timeout
        )
        for node in (0, 1)
    ]


def test_a_failure_reaches_the_other_node_fast_and_both_agree_who_was_first() -> None:
    a, b = agents()
    try:
        time.sleep(0.3)
        sent = time.monotonic()
        b.report_failure(Failure("rank 3", 3, 1, 137, 9, [], None))
        event = None
        while event is None and time.monotonic() - sent < 2:
            event = a.poll()
            time.sleep(0.001)
        assert isinstance(event, RemoteFailure) and time.monotonic() - sent < 0.2
        assert a.first_failure(0, 1) == b.first_failure(0, 1) == event
        assert "node 1" in event.describe() and "SIGKILL" in event.describe()
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.append(b.exchange("cand/k", [1, 2], time.monotonic() + 2)))
        thread.start()
        assert a.exchange("cand/k", [2, 3], time.monotonic() + 2) == {0: [2, 3], 1: [1, 2]}
        thread.join()
        assert got == [{0: [2, 3], 1: [1, 2]}]
    finally:
        b.close(0)
        a.close(0)


def test_a_hang_carries_its_cause_so_the_other_nodes_dump_their_stacks_and_status_is_relayed() -> None:
    a, b = agents()
    try:
        time.sleep(0.3)
        cause = "hung: no progress for 3s (monitor.hang_timeout) on host h1, last step 6"
        b.report_failure(Failure("rank 3", 3, 77, 137, None, [], None, cause=cause))
        event = None
        deadline = time.monotonic() + 2
        while not isinstance(event, RemoteFailure) and time.monotonic() < deadline:
            event = a.poll()
            time.sleep(0.001)
        assert isinstance(event, RemoteFailure) and event.hung and event.cause == cause
        failure = event.as_failure()
        assert failure.describe() == f"node 1 rank 3 {cause}"  # no "(pid 0)": the pid lives on the other node
        b.publish({"index": 1, "host": "h1", "ranks": [{"rank": 3, "step": 6}]})
        a.publish({"index": 0, "host": "h0", "ranks": [{"rank": 0, "step": 6}]})
        deadline = time.monotonic() + 3
        while (len(a.view()) < 2 or len(b.view()) < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(a.view()) == sorted(b.view()) == [0, 1]
        assert b.view()[0]["host"] == "h0" and a.view()[1]["ranks"][0]["step"] == 6
    finally:
        b.close(0)
        a.close(0)


def test_a_failure_left_over_from_an_ended_attempt_does_not_stop_the_next() -> None:
    """An attempt can end through another channel (MPI's completion channel) before its plane event is polled."""
    a, b = agents()
    try:
        time.sleep(0.3)
        b.report_failure(Failure("rank 3", 3, 1, 7, None, [], None))
        assert a.first_failure(0, 2) is not None  # arrived, not polled
        a.start_generation(1)
        b.start_generation(1)
        time.sleep(0.2)
        assert a.poll() is None  # generation 0's failure does not stop generation 1
        b.report_failure(Failure("rank 2", 2, 1, 5, None, [], None))
        deadline = time.monotonic() + 2
        event = None
        while event is None and time.monotonic() < deadline:
            event = a.poll()
            time.sleep(0.01)
        assert isinstance(event, RemoteFailure) and event.generation == 1 and event.exit_code == 5
    finally:
        b.close(0)
        a.close(0)


def test_a_silent_node_is_lost_and_exchanges_end() -> None:
    a, b = agents(node_timeout=1.0)
    try:
        time.sleep(0.3)
        b._halt.set()  # its agent thread stops: no heartbeat any more (as if killed)
        b._thread.join()
        with pytest.raises(ExchangeFailed, match="node 1"):
            a.exchange("start/1", None, time.monotonic() + 5)
        assert isinstance(a.lost, Lost) and a.lost.node == 1
    finally:
        a.close(1)


def test_messages_are_authenticated() -> None:
    frames = seal(b"secret", {"t": "fail", "node": 1})
    assert unseal(b"secret", frames) == {"t": "fail", "node": 1}
    assert unseal(b"other", frames) is None
    assert unseal(b"secret", [frames[0].replace(b"1", b"0"), frames[1]]) is None
    one = job_secret("job", "10.0.0.1", 7666, {})
    assert one != job_secret("job2", "10.0.0.1", 7666, {}) and one != job_secret(
        "job", "10.0.0.1", 7666, {"MA_JOB_ID": "x"}
    )


def test_local_events_need_no_network() -> None:
    events = LocalEvents()
    events.report_failure(Failure("rank 1", 1, 5, 3, None, [], None))
    assert events.first_failure(0) == RemoteFailure(0, 1, "rank 1", 3, None)
    assert events.exchange("x", 1, 0) == {0: 1} and events.poll() is None and not events.networked


def test_a_torch_record_error_file_is_in_the_summary(tmp_path: Path) -> None:
    error_file = tmp_path / "rank_1.json"
    message = {
        "message": "ValueError: bad batch",
        "extraInfo": {"py_callstack": "Traceback...\n  line 3", "timestamp": "1"},
    }
    error_file.write_text(json.dumps({"message": message}))
    spec = ProcessSpec(1, 1, ["x"], {"TORCHELASTIC_ERROR_FILE": str(error_file)}, ".")
    lines = error_file_lines([spec], 1)
    assert "ValueError: bad batch" in lines[0] and any("line 3" in line for line in lines)
