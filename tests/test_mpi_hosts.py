"""The MPI engine across real hosts: three network-namespace "machines", each running its own
``mlaunch --engine mpi job.yaml`` with ModelArts-style env, real sshd, real Open MPI, mpi4py.

Nothing is faked: each host has its own network stack, hostname and /etc/hosts
(``tests/netns.py``); node 0's mlaunch checks the peers' sshd with paramiko, runs mpirun over
ssh with the job's key and pinned host key, and the peers exit with the code node 0 sends.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd
from netns import Host, NetnsHosts, netns_unavailable_reason

pytestmark = pytest.mark.netns

if shutil.which("mpirun") is None or shutil.which("sshd", path="/usr/sbin:/usr/bin:/sbin") is None:
    pytest.skip(
        "needs Open MPI and OpenSSH (apt-get install openmpi-bin libopenmpi-dev openssh-server openssh-client)",
        allow_module_level=True,
    )
pytest.importorskip("mpi4py", reason="needs mpi4py (pip install mpi4py)")

RANK_SCRIPT = r"""
import json, os, socket, sys, time
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
mode = sys.argv[1] if len(sys.argv) > 1 else "sum"
out = os.environ["PROBE_DIR"] if "PROBE_DIR" in os.environ else None
total = comm.allreduce(rank + 1)
print(f"rank {rank} of {world} on {socket.gethostname()} sum {total}", flush=True)
if mode == "exit7" and rank == 3:
    os._exit(7)
if mode == "exit7-once" and rank == 3 and os.environ["MLAUNCH_RESTART_COUNT"] == "0":
    os._exit(7)
if mode == "sleep":
    print(f"ready {rank}", flush=True)
    time.sleep(120)
if mode == "probe":
    # What this rank and the launcher that started it (mpirun on node 0, orted elsewhere) carry.
    def proc(pid):
        read = lambda name: open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace")
        return {"environ": read("environ").split("\0"), "cmdline": read("cmdline").split("\0")}
    record = {"rank": rank, "host": socket.gethostname(), "env": dict(os.environ), "parent": proc(os.getppid())}
    with open(os.path.join(os.environ["MLAUNCH_CHECKPOINT_DIR"], f"probe-{rank}.json"), "w") as fh:
        json.dump(record, fh)
    comm.Barrier()
    flag = os.path.join(os.environ["MLAUNCH_CHECKPOINT_DIR"], "go")
    while not os.path.exists(flag):
        time.sleep(0.05)
comm.Barrier()
if rank == 0:
    print(f"allreduce-sum {total} world {world}", flush=True)
"""

# Planted in every host's env: names the platform really injects (ModelArts' script copied
# S3_*, SCC* and CRED* into its tune file) and generic credential names.
SECRET_NAMES = (
    "S3_SECRET_ACCESS_KEY",
    "S3_ACCESS_KEY_ID",
    "SCC_TOKEN",
    "CRED_PASSWORD",
    "MA_SECRET_KEY",
    "AWS_SESSION_TOKEN",
    "NCCL_SECRET_TOKEN",
    "MY_API_TOKEN",
    "DB_PASSWORD",
)


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with NetnsHosts(3) as net:
        yield net.hosts


@dataclass
class Node:
    host: Host
    proc: subprocess.Popen[str]
    env: dict[str, str]
    out: str = ""
    code: int | None = None


@dataclass
class MpiJob:
    """A job directory (script, job.yaml, ssh secret) and the three mlaunch processes running it."""

    tmp: Path
    hosts: list[Host]
    args: tuple[str, ...] = ()
    options: str = ""
    peer_timeout: float = 30
    extra: str = ""  # more top-level job.yaml
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.tmp / "ranks.py").write_text(RANK_SCRIPT)
        self.keys = self.tmp / "ssh"
        subprocess.run([*mlaunch_cmd(), "keys", str(self.keys)], check=True, capture_output=True, cwd=ROOT)
        self.ckpt = self.tmp / "ckpt"
        self.ckpt.mkdir()
        self.job = self.tmp / "job.yaml"
        self.job.write_text(
            f"name: mpi-hosts-{secrets.token_hex(3)}\nentry: ranks.py\nargs: {json.dumps(list(self.args))}\n"
            f"log_dir: {self.tmp / 'logs'}\ncheckpoint: {{dir: {self.ckpt}, grace_period: 10s}}\n"
            f"mpi: {{keys_dir: ssh, interfaces: [eth0], peer_timeout: {self.peer_timeout}, node0_timeout: 4"
            f"{self.options}}}\n{self.extra}"
        )

    def env(self, host: Host, **extra: str) -> dict[str, str]:
        return clean_env(
            VC_WORKER_HOSTS=",".join(h.name for h in self.hosts),
            VC_TASK_INDEX=str(host.index),
            MA_NUM_HOSTS=str(len(self.hosts)),
            MA_NUM_GPUS="2",
            MA_VJ_NAME=self.hosts[0].name.split(".", 1)[1],
            MA_TASK_NAME="worker",
            **extra,
        )

    def start(self, envs: dict[int, dict[str, str]] | None = None) -> None:
        for host in self.hosts:
            env = (envs or {}).get(host.index) or self.env(host)
            proc = host.popen(
                [*mlaunch_cmd(), "--engine", "mpi", str(self.job)],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            self.nodes.append(Node(host, proc, env))

    def wait(self, timeout: float = 90) -> list[Node]:
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            try:
                node.out, _ = node.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other in self.nodes:
                    other.proc.kill()
                raise AssertionError(f"host {node.host.index} did not finish: " + self.dump()) from None
            node.code = node.proc.returncode
        return self.nodes

    def dump(self) -> str:
        return "\n".join(f"--- host {n.host.index} (exit {n.code}) ---\n{n.out}" for n in self.nodes)

    def runtime_dirs(self) -> list[Path]:
        plans = []
        for node in self.nodes:
            result = subprocess.run(
                [*mlaunch_cmd(), "plan", "--json", "--engine", "mpi", str(self.job)],
                env=node.env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            steps = json.loads(result.stdout)["nodes"][0]["bootstrap"]
            plans.append(Path(next(s["params"]["to"] for s in steps if s["name"] == "keys")))
        return plans


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def assert_hosts_empty(hosts: list[Host]) -> None:
    """No process of the job (sshd, orted, ranks, mlaunch) is left on any host."""
    wait_for(lambda: not any(h.pids() for h in hosts), 10, "every host to be empty")


def test_allreduce_across_three_hosts_with_modelarts_env(tmp_path: Path, hosts: list[Host]) -> None:
    job = MpiJob(tmp_path, hosts)
    job.start()
    nodes = job.wait()
    assert [n.code for n in nodes] == [0, 0, 0], job.dump()
    head = nodes[0].out
    assert "allreduce-sum 21 world 6" in head, job.dump()
    placed = dict(re.findall(r"rank (\d) of 6 on (\S+) sum 21", head))
    assert sorted(placed) == [str(r) for r in range(6)], head
    # -map-by slot with 2 slots per host: ranks 0-1 on node 0, 2-3 on node 1, 4-5 on node 2.
    assert [placed[str(r)] for r in range(6)] == [h.hostname for h in hosts for _ in range(2)]
    assert re.search(r"all 3 host\(s\) accept the job key after [0-9.]+s", head), head
    for node in nodes[1:]:
        assert "reports the job ended with exit code 0" in node.out, job.dump()
    assert_hosts_empty(hosts)
    assert not any(d.exists() for d in job.runtime_dirs())  # key copies and configs are gone too


def test_rank_exit_7_ends_every_host_non_zero_and_node0_with_7(tmp_path: Path, hosts: list[Host]) -> None:
    job = MpiJob(tmp_path, hosts, args=("exit7",))
    job.start()
    nodes = job.wait()
    assert nodes[0].code == 7, job.dump()
    assert all(n.code != 0 for n in nodes), job.dump()
    assert [n.code for n in nodes[1:]] == [7, 7], job.dump()
    assert_hosts_empty(hosts)


def test_every_host_restarts_together_after_a_failure(tmp_path: Path, hosts: list[Host]) -> None:
    """restart.max_restarts on each node: attempt 0 fails (exit 7), attempt 1 runs on every host."""
    job = MpiJob(tmp_path, hosts, args=("exit7-once",), extra="restart: {max_restarts: 1, backoff: 0.5s}\n")
    job.start()
    nodes = job.wait()
    assert [n.code for n in nodes] == [0, 0, 0], job.dump()
    assert nodes[0].out.count("allreduce-sum 21 world 6") == 1, job.dump()
    assert "restarting the group (1/1)" in nodes[0].out
    for node in nodes[1:]:
        # Attempt 0 ends on a peer with the control plane's job-wide failure (node 0's mpirun exited 7),
        # attempt 1 with node 0's last word on the plane: the job ended with code 0.
        first, _, second = node.out.partition("attempt 1")
        assert re.search(r"job-wide failure: node 0 .* exited with code 7", first), job.dump()
        assert "restarting the group (1/1)" in first, job.dump()
        codes = re.findall(r"node 0 \(\S+\) reports the job ended with exit code (\d+)", second)
        assert codes == ["0"], job.dump()
    assert_hosts_empty(hosts)


def test_sigterm_to_node0_stops_the_job_on_every_host(tmp_path: Path, hosts: list[Host]) -> None:
    job = MpiJob(tmp_path, hosts, args=("sleep",))
    job.start()
    log = tmp_path / "logs" / "node0-mpirun.log"
    wait_for(lambda: log.exists() and len(re.findall(r"ready \d", log.read_text())) == 6, 60, "6 ranks ready")
    stopped = time.monotonic()
    os.kill(job.nodes[0].proc.pid, signal.SIGTERM)
    nodes = job.wait(timeout=30)
    assert time.monotonic() - stopped < 20, job.dump()
    assert nodes[0].code == 128 + signal.SIGTERM, job.dump()
    assert all(n.code not in (0, None) for n in nodes), job.dump()
    assert_hosts_empty(hosts)


def test_peers_exit_non_zero_when_node0_vanishes(tmp_path: Path, hosts: list[Host]) -> None:
    """kill -9 of everything on node 0: the peers give up and exit non-zero.

    ``mpi.node0_timeout`` (4 s) is the older name of ``monitor.node_timeout``: the control plane declares
    node 0 lost. Its processes' deaths close their connections, so the peers judge it after the short fuse
    (a few heartbeats) instead; a machine that vanishes closes nothing and gets the whole timeout
    (``test_control_plane.py``'s stalled node 0).
    """
    job = MpiJob(tmp_path, hosts, args=("sleep",))
    job.start()
    log = tmp_path / "logs" / "node0-mpirun.log"
    wait_for(lambda: log.exists() and len(re.findall(r"ready \d", log.read_text())) == 6, 60, "6 ranks ready")
    runtime = job.runtime_dirs()
    vanished = time.monotonic()
    for pid in hosts[0].pids():
        os.kill(pid, signal.SIGKILL)
    nodes = job.wait(timeout=40)
    assert not any(d.exists() for d in runtime[1:])  # the peers cleaned up after themselves
    shutil.rmtree(runtime[0])  # node 0 could not: it was killed
    assert nodes[0].code == -signal.SIGKILL
    for node in nodes[1:]:
        assert node.code not in (0, None), job.dump()
        said = r"node 0 \(the master.*; its connection closed\) is lost: its mlaunch sent nothing for [1-3]\."
        assert re.search(said, node.out), job.dump()
    assert time.monotonic() - vanished < 25, job.dump()
    assert_hosts_empty(hosts)


def test_security_no_credentials_reach_mpirun_keys_private_password_refused(tmp_path: Path, hosts: list[Host]) -> None:
    job = MpiJob(tmp_path, hosts, args=("probe",), options=", export: [MA_*]")
    planted = {name: f"planted-{secrets.token_hex(8)}" for name in SECRET_NAMES}
    job.start({h.index: job.env(h, NCCL_DEBUG="WARN", **planted) for h in hosts})
    wait_for(lambda: len(list(job.ckpt.glob("probe-*.json"))) == 6, 60, "6 rank probes")
    runtime = job.runtime_dirs()
    try:
        # Key material: private files 0600 in 0700 directories, on every host.
        for directory in runtime:
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
            for path in directory.iterdir():
                mode = stat.S_IMODE(path.stat().st_mode)
                if path.name != "sshd.pid":
                    assert mode == 0o600, f"{path} is {oct(mode)}"
        for name in ("id_ed25519", "ssh_host_ed25519_key", "authorized_keys"):
            assert stat.S_IMODE((job.keys / name).stat().st_mode) == 0o600
        # Password login is refused outright: sshd offers public-key authentication only.
        probe = hosts[0].run(
            [sys.executable, "-c", PASSWORD_PROBE, hosts[1].name, "36666"], env=clean_env(), cwd=str(ROOT)
        )
        assert probe.stdout.strip() == "refused ['publickey']", probe.stdout + probe.stderr
        records = [json.loads(p.read_text()) for p in sorted(job.ckpt.glob("probe-*.json"))]
        # Everything mlaunch wrote on each host (read now: key copies are removed when the job ends).
        texts = [p.read_text(errors="replace") for d in runtime for p in d.iterdir() if p.is_file()]
    finally:
        (job.ckpt / "go").touch()
    nodes = job.wait()
    assert [n.code for n in nodes] == [0, 0, 0], job.dump()
    texts += [p.read_text(errors="replace") for p in (tmp_path / "logs").iterdir()] + [n.out for n in nodes]
    for record in records:
        env = record["env"]
        assert env["NCCL_DEBUG"] == "WARN" and env["MA_NUM_HOSTS"] == "3"  # what the job needs does arrive
        assert env["MLAUNCH_JOB_NAME"].startswith("mpi-hosts-")
        texts += [json.dumps(env), json.dumps(record["parent"])]
        assert not set(SECRET_NAMES) & set(env), record["rank"]
    assert {r["host"] for r in records} == {h.hostname for h in hosts}
    launchers = {tuple(r["parent"]["cmdline"][:1]) for r in records}
    assert any("mpirun" in c[0] for c in launchers) and any("orted" in c[0] for c in launchers), launchers
    for name, value in planted.items():
        leaks = [t[:200] for t in texts if value in t]
        assert not leaks, f"{name} leaked: {leaks}"
    assert_hosts_empty(hosts)


PASSWORD_PROBE = r"""
import sys, socket, paramiko
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
t = paramiko.Transport(sock)
t.start_client(timeout=10)
try:
    t.auth_password("root", "root")
    print("accepted")
except paramiko.BadAuthenticationType as exc:
    print("refused", exc.allowed_types)
except paramiko.AuthenticationException as exc:
    print("refused-after-try", exc)
"""


def test_a_host_with_another_host_key_is_refused(tmp_path: Path, hosts: list[Host]) -> None:
    """Host 2 runs the job with a different secret: node 0 refuses its host key and names it.

    Host 2 cannot speak on the job's control plane either (its key is derived from the ssh secret
    too): it hears nothing and gives up after ``monitor.join_timeout``.
    """
    job = MpiJob(tmp_path, hosts, peer_timeout=5, extra="monitor: {join_timeout: 8s}\n")
    rogue = tmp_path / "rogue-ssh"
    subprocess.run([*mlaunch_cmd(), "keys", str(rogue)], check=True, capture_output=True, cwd=ROOT)
    envs = {h.index: job.env(h) for h in hosts}
    envs[2] = job.env(hosts[2], MLAUNCH_SSH_KEYS=str(rogue))
    job.job.write_text(job.job.read_text().replace("keys_dir: ssh, ", ""))
    for index in (0, 1):
        envs[index]["MLAUNCH_SSH_KEYS"] = str(job.keys)
    job.start(envs)
    head = job.nodes[0]
    head.out, _ = head.proc.communicate(timeout=60)
    assert head.proc.returncode != 0, head.out
    assert re.search(rf"refused to trust 1 host\(s\): {re.escape(hosts[2].name)}: presented host key", head.out), (
        head.out
    )
    # The head's failure is job-wide: the peers (the rogue one included) end with it, their sshd too.
    job.wait(timeout=30)
    assert all(n.code != 0 for n in job.nodes), job.dump()
    assert "it never answered: not started, unreachable, or another job secret" in job.nodes[2].out, job.dump()
    # With the encrypted wire (CURVE keys from the job secret) the other job's node never completes the handshake,
    # so none of its messages reaches the hub's MAC check (tests/test_control_trust.py counts such handshakes).
    assert_hosts_empty(hosts)
