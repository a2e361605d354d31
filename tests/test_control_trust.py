"""The control plane's trust (issue 47): who may speak on it, and what node 0 says when nothing keys it.

Real pyzmq sockets on loopback, a real hub and real agents; a stranger is a raw TCP socket or a
zmq socket of the test's own.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from launchers.config.job import Job
from launchers.control import open_job_events
from launchers.platform.cluster import Cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node0(env: dict[str, str], key_file: str = "") -> Cluster:
    return Cluster(
        source="manual", simulated=False, nnodes=2, node_rank=0, procs_per_node=1,
        master_addr="127.0.0.1", master_port=free_port(), env=env, control_key=key_file,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("env", "key_file", "warned"),
    [({}, False, True), ({"MLAUNCH_JOB_SECRET": "0123abcd"}, False, False), ({}, True, False)],
    ids=["nothing", "secret", "mpi-ssh-key"],
)
def test_node0_says_once_when_the_plane_is_keyed_from_public_facts(
    env: dict[str, str], key_file: bool, warned: bool, tmp_path: Any, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("MLAUNCH_JOB_SECRET", raising=False)
    key = tmp_path / "id"
    key.write_bytes(b"the job's ssh key")
    events = open_job_events(Job(name="demo", entry="train.py"), node0(env, str(key) if key_file else ""))
    try:
        err = capsys.readouterr().err
    finally:
        events.close(0)
    said = [line for line in err.splitlines() if "public facts" in line]
    assert len(said) == (1 if warned else 0), err
    if warned:
        assert "MLAUNCH_JOB_SECRET" in said[0]
