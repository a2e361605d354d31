"""The control plane's trust (issue 47): who may speak on it, and what node 0 says when nothing keys it.

Real pyzmq sockets on loopback, a real hub and real agents; a stranger is a raw TCP socket or a
zmq socket of the test's own.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, run_mlaunch
from netns import Host, hosts_fixture

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


# ----------------------------------------------------------------------------------------
# A stranger host on the job's bridge
# ----------------------------------------------------------------------------------------

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3")
STRANGER = ROOT / "tests" / "scripts" / "stranger.py"
BEHAVE = ROOT / "tests" / "scripts" / "behave.py"
NODE_TIMEOUT = 3.0


@pytest.mark.netns
def test_a_stranger_host_changes_nothing_and_is_counted_in_status(tmp_path: Path, hosts3: list[Host]) -> None:
    """Two job hosts with a random MLAUNCH_JOB_SECRET; the third host, without it, attacks node 0's control
    port for 10 s (held connections, garbage, forged messages, a 128 MiB frame, a connection flood).

    With node_timeout 3 s, a heartbeat the attack held up by 3 s would lose a node: both exit 0, no
    restart, no loss, and node 0's ``mlaunch status`` counts what it refused."""
    job_hosts, stranger = hosts3[:2], hosts3[2]
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: trust\nengine: pytorch\nentry: {BEHAVE}\nnodes: 2\nprocs_per_node: 1\nlog_dir: {tmp_path / 'logs'}\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\nmonitor: {{node_timeout: {NODE_TIMEOUT}s}}\n"
    )
    secret = secrets.token_hex(32)
    procs = []
    for host in job_hosts:
        env = clean_env(
            MA_NUM_GPUS="1", MA_NUM_HOSTS="2", VC_TASK_INDEX=str(host.index), GLOO_SOCKET_IFNAME="eth0",
            VC_WORKER_HOSTS=",".join(h.name for h in job_hosts), MLAUNCH_JOB_SECRET=secret, BEHAVE="sleep:16",
        )  # fmt: skip
        argv = [*mlaunch_cmd(), "--engine", "pytorch", str(job), "--init_method", f"tcp://{job_hosts[0].name}:6666"]
        argv += ["--rank", str(host.index), "--world_size", "2"]
        procs.append(host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    attack = stranger.run(
        [sys.executable, str(STRANGER), job_hosts[0].ip, "7666", "trust", "10"],
        env=clean_env(PYTHONPATH=str(ROOT)), timeout=90,
    )  # fmt: skip
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        results.append((proc.returncode, out, err))
    text = f"stranger:\n{attack.stdout}{attack.stderr}\n" + "\n".join(
        f"--- host {i} exit {rc}\n{out}\n{err}" for i, (rc, out, err) in enumerate(results)
    )
    assert attack.returncode == 0 and "stranger: flood_connections" in attack.stdout, text
    assert [rc for rc, _, _ in results] == [0, 0], text
    for _, _, err in results:
        assert "attempt 1" not in err and "lost" not in err and "left out" not in err, text
    status = json.loads((tmp_path / "logs" / "status.json").read_text())
    plane = status["control_plane"]
    assert status["restarts"] == 0 and plane["encrypted"] is True, text
    assert plane["unverified"] == plane["malformed"] == 0, plane  # nothing a stranger sent reached the MAC check
    assert plane["handshake_failed"] >= 2, plane  # the NULL and the CURVE peers with guessed keys
    flood = int(re.search(r"stranger: flood_connections (\d+)", attack.stdout).group(1))  # type: ignore[union-attr]
    assert plane["handshake_failed"] + plane["closed_unauthenticated"] >= 200 + flood, (plane, attack.stdout)
    shown = run_mlaunch(["status", str(job)], timeout=60).stdout
    assert "control plane: refused" in shown
