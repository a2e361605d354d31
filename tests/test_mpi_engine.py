"""The MPI engine on one machine: plans for every node role and input, user errors, and real
local runs (mpirun on localhost with nodes × procs_per_node slots, no sshd)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, clean_env, mlaunch_cmd, run_mlaunch

from launchers.config.job import load_job
from launchers.plan import LaunchPlan
from launchers.run.runner import make_plan

needs_mpi = pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)
HOSTS = "job-worker-0.job,job-worker-1.job,job-worker-2.job"


def write_job(tmp_path: Path, body: str = "", *, keys: bool = True, entry: str = "app.py") -> Path:
    (tmp_path / entry).write_text("print('hello')\n")
    if keys:
        run = subprocess.run([*mlaunch_cmd(), "keys", str(tmp_path / "ssh")], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    job = tmp_path / "job.yaml"
    job.write_text(f"name: demo\nentry: {entry}\nprocs_per_node: 2\n{body}")
    return job


def platform_env(index: int, **extra: str) -> dict[str, str]:
    return clean_env(VC_WORKER_HOSTS=HOSTS, VC_TASK_INDEX=str(index), MA_NUM_HOSTS="3", MA_NUM_GPUS="2", **extra)


def plan_of(job_file: Path, env: dict[str, str], *args: str) -> LaunchPlan:
    _, _, plan = make_plan(load_job(job_file), "mpi", list(args), env)
    return plan


def mpirun_part(argv: list[str]) -> list[str]:
    return argv[argv.index("--") + 1 :]


def exported(argv: list[str]) -> list[str]:
    return [value for flag, value in zip(argv, argv[1:], strict=False) if flag == "-x"]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# ----------------------------------------------------------------------------------------
# Plans
# ----------------------------------------------------------------------------------------


def test_local_simulation_is_one_mpirun_on_localhost_without_sshd(tmp_path: Path) -> None:
    job = write_job(tmp_path, "nodes: 2\nmpi: {interfaces: [eth0]}\n", keys=False)
    plan = plan_of(job, clean_env())
    assert plan.simulated and plan.world_size == 4 and len(plan.nodes) == 1
    [proc] = plan.processes
    assert proc.argv[1:3] == ["-m", "bootstrap.head"] and "--local" in proc.argv
    assert [s.name for s in plan.nodes[0].bootstrap] == ["runtime_dir", "hostfile"]
    mpirun = mpirun_part(proc.argv)
    assert option(mpirun, "-np") == "4"
    assert "plm_rsh_args" not in mpirun and "btl_tcp_if_include" not in mpirun
    assert ("--allow-run-as-root" in mpirun) == (os.geteuid() == 0)
    assert mpirun[-2:] == ["-u", str(tmp_path / "app.py")]
    assert any("interfaces" in note for note in plan.notes)


def test_node0_plan_waits_for_peers_and_runs_mpirun_over_pinned_ssh(tmp_path: Path) -> None:
    job = write_job(tmp_path, "mpi: {keys_dir: ssh, interfaces: [eth0, bond0], sshd_port: 36666}\n")
    plan = plan_of(job, platform_env(0, NCCL_DEBUG="INFO", LD_LIBRARY_PATH="/opt/lib"), "--data_url", "s3://x")
    assert not plan.simulated and plan.nnodes == 3 and plan.world_size == 6
    node = plan.nodes[0]
    assert node.index == 0 and node.host == "job-worker-0.job"
    steps = {s.name: s.params for s in node.bootstrap}
    assert list(steps) == ["keys", "sshd", "wait_for_peers", "hostfile", "completion"]
    assert steps["wait_for_peers"]["hosts"] == HOSTS.split(",") and steps["sshd"]["port"] == 36666
    assert steps["keys"]["from"] == str(tmp_path / "ssh")
    assert steps["completion"] == {"role": "notify", "port": 36667, "peers": HOSTS.split(",")[1:]}
    [proc] = node.processes
    assert proc.role == "mpirun" and option(proc.argv, "--hosts") == HOSTS
    mpirun = mpirun_part(proc.argv)
    assert option(mpirun, "-np") == "6" and option(mpirun, "-hostfile").endswith("/hostfile")
    rsh = mpirun[mpirun.index("plm_rsh_args") + 1].split()
    assert rsh[:2] == ["-p", "36666"] and "StrictHostKeyChecking=yes" in rsh and "HostKeyAlias=mlaunch-job" in rsh
    assert "StrictHostKeyChecking=no" not in rsh and "UserKnownHostsFile=/dev/null" not in rsh
    assert option(mpirun, "btl_tcp_if_include") == "eth0,bond0" == option(mpirun, "oob_tcp_if_include")
    assert " ".join(mpirun).count("-bind-to none -map-by slot") == 1
    names = exported(mpirun)
    assert {"PATH", "LD_LIBRARY_PATH", "NCCL_DEBUG", "MLAUNCH_JOB_NAME", "NCCL_SOCKET_IFNAME=eth0,bond0"} <= set(names)
    assert mpirun[-2:] == ["--data_url", "s3://x"]  # the platform's appended args reach the program


def test_peer_plan_runs_sshd_and_waits_for_node0(tmp_path: Path) -> None:
    job = write_job(tmp_path, "mpi: {keys_dir: ssh, node0_timeout: 20, peer_timeout: 100, completion_port: 40000}\n")
    plan = plan_of(job, platform_env(2))
    node = plan.nodes[0]
    assert node.index == 2 and node.host == "job-worker-2.job"
    assert [s.name for s in node.bootstrap] == ["keys", "sshd", "completion"]
    [proc] = node.processes
    assert proc.role == "peer" and proc.argv[1:3] == ["-m", "bootstrap.peer"]
    assert option(proc.argv, "--node0") == "job-worker-0.job"
    assert "mpirun" not in " ".join(proc.argv)
    # node 0's exit code, failures and a lost node 0 travel on the job's control plane, on completion_port
    [completion] = [s for s in node.bootstrap if s.name == "completion"]
    assert completion.params["port"] == 40000
    assert plan.control_port == 40000


def test_node0_timeout_is_the_older_name_of_monitor_node_timeout(tmp_path: Path) -> None:
    from launchers.control import node_timeout

    def timeout_of(body: str) -> float:
        return node_timeout(load_job(write_job(tmp_path, body, keys=False)))

    assert timeout_of("mpi: {node0_timeout: 20}\n") == 20
    assert timeout_of("mpi: {node0_timeout: 20}\nmonitor: {node_timeout: 7s}\n") == 7
    assert timeout_of("mpi: {}\n") == 30


def test_exports_exactly_what_the_job_needs_and_never_credentials(tmp_path: Path) -> None:
    job = write_job(tmp_path, "env: {GLOG_v: '2'}\nmpi: {keys_dir: ssh, export: [MA_*, MY_SETTING]}\n")
    env = platform_env(
        0,
        NCCL_IB_HCA="mlx5",
        NCCL_SECRET_TOKEN="x",
        MA_SECRET_KEY="x",
        MA_JOB_DIR="/job",
        S3_SECRET_ACCESS_KEY="x",
        SCC_TOKEN="x",
        CRED_X="x",
        AWS_ACCESS_KEY_ID="x",
        HOME_TOKEN="x",
        UNRELATED="x",
        MY_SETTING="1",
    )
    names = exported(mpirun_part(plan_of(job, env).processes[0].argv))
    assert {"NCCL_IB_HCA", "MA_JOB_DIR", "MA_NUM_HOSTS", "GLOG_v", "MY_SETTING", "PATH"} <= set(names)
    for bad in ("NCCL_SECRET_TOKEN", "MA_SECRET_KEY", "S3_SECRET_ACCESS_KEY", "SCC_TOKEN", "CRED_X", "UNRELATED"):
        assert bad not in names
    assert "AWS_ACCESS_KEY_ID" not in names and "HOME_TOKEN" not in names
    assert all("=" not in n or n.startswith("NCCL_SOCKET_IFNAME") for n in names)  # values stay out of argv


def test_flavours(tmp_path: Path) -> None:
    job = write_job(tmp_path, "mpi: {keys_dir: ssh, flavour: horovod}\n")
    mpirun = mpirun_part(plan_of(job, platform_env(0, HOROVOD_FUSION_THRESHOLD="0", GLOG_v="1")).processes[0].argv)
    assert "pml" in mpirun and "^openib" in mpirun
    assert "HOROVOD_FUSION_THRESHOLD" in exported(mpirun) and "GLOG_v" not in exported(mpirun)
    job.write_text(job.read_text().replace("horovod", "mindspore-gpu"))
    mpirun = mpirun_part(plan_of(job, platform_env(0, HOROVOD_X="0", GLOG_v="1")).processes[0].argv)
    assert "GLOG_v" in exported(mpirun) and "HOROVOD_X" not in exported(mpirun)


def test_hosts_from_volcano_files_then_job_yaml(tmp_path: Path) -> None:
    job = write_job(tmp_path, "mpi: {keys_dir: ssh, hosts: [a, b]}\n")
    volcano = tmp_path / "volcano"
    volcano.mkdir()
    (volcano / "worker.host").write_text("w-0.j\nw-1.j\n")
    env = clean_env(VC_TASK_INDEX="1", MLAUNCH_VOLCANO_DIR=str(volcano))
    plan = plan_of(job, env)
    assert plan.nodes[0].host == "w-1.j" and any("worker.host" in n for n in plan.notes)
    (volcano / "worker.host").unlink()
    plan = plan_of(job, env)
    assert plan.nodes[0].host == "b" and any("mpi.hosts" in n for n in plan.notes)
    # VC_WORKER_HOSTS wins over both
    plan = plan_of(job, platform_env(1, MLAUNCH_VOLCANO_DIR=str(volcano)))
    assert plan.nodes[0].host == "job-worker-1.job"
    # MA_VJ_NAME naming (ma-job → modelarts-job) when VC_WORKER_HOSTS is absent
    env = clean_env(MA_VJ_NAME="ma-job-42", MA_TASK_NAME="worker", MA_NUM_HOSTS="2", VC_TASK_INDEX="0")
    plan = plan_of(job, env)
    assert plan.nodes[0].bootstrap[2].params["hosts"] == [
        f"modelarts-job-42-worker-{i}.modelarts-job-42" for i in (0, 1)
    ]


def test_plan_json_shows_bootstrap_steps(tmp_path: Path) -> None:
    job = write_job(tmp_path, "mpi: {keys_dir: ssh}\n")
    result = run_mlaunch(["plan", "--json", "--engine", "mpi", str(job)], env=platform_env(1))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["engine"] == "mpi" and data["world_size"] == 6 and data["nnodes"] == 3
    assert [s["name"] for s in data["nodes"][0]["bootstrap"]] == ["keys", "sshd", "completion"]
    text = run_mlaunch(["plan", "--engine", "mpi", str(job)], env=platform_env(0)).stdout
    assert "bootstrap: wait_for_peers" in text and "bootstrap: sshd" in text


# ----------------------------------------------------------------------------------------
# User errors: exit 2, one message, nothing started
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "keys", "env", "expected"),
    [
        ("", False, {}, r"needs the job's ssh secret on every node.*mlaunch keys DIR"),
        ("mpi: {keys_dir: nowhere}\n", False, {}, r"ssh secret \(mpi.keys_dir .*\) is not usable: .*nowhere"),
        ("mpi: {export: [S3_SECRET_ACCESS_KEY]}\n", False, {}, r"looks like a credential"),
        ("mpi: {export: ['bad name']}\n", False, {}, r"not an environment variable name"),
        (
            "mpi: {keys_dir: ssh}\n",
            True,
            {"VC_WORKER_HOSTS": "a,b"},
            r"VC_WORKER_HOSTS lists 2 hosts but MA_NUM_HOSTS=3",
        ),
        ("mpi: {keys_dir: ssh, sshd_port: 65535}\n", True, {}, r"completion_port 65536"),
    ],
)
def test_user_errors_exit_2_with_a_message(
    tmp_path: Path, body: str, keys: bool, env: dict[str, str], expected: str
) -> None:
    job = write_job(tmp_path, body, keys=keys)
    result = run_mlaunch(["--engine", "mpi", str(job)], env={**platform_env(0), **env})
    assert result.returncode == 2, result.stderr
    assert re.search(expected, result.stderr, re.S), result.stderr
    assert "Traceback" not in result.stderr


def test_broken_secret_is_named(tmp_path: Path) -> None:
    job = write_job(tmp_path, "mpi: {keys_dir: ssh}\n")
    (tmp_path / "ssh" / "ssh_host_ed25519_key").unlink()
    result = run_mlaunch(["--engine", "mpi", str(job)], env=platform_env(0))
    assert result.returncode == 2 and "lacks ssh_host_ed25519_key" in result.stderr, result.stderr


# ----------------------------------------------------------------------------------------
# mlaunch keys / mlaunch check
# ----------------------------------------------------------------------------------------


def test_keys_command_writes_a_private_secret_and_refuses_to_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    result = run_mlaunch(["keys", str(target)])
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in target.iterdir()}
    assert set(files) == {
        "id_ed25519",
        "id_ed25519.pub",
        "authorized_keys",
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
        "known_hosts",
    }
    assert set(files.values()) == {0o600}
    client = (target / "id_ed25519.pub").read_text().split()[:2]
    assert (target / "authorized_keys").read_text().split()[:2] == client
    host = (target / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert (target / "known_hosts").read_text().split() == ["mlaunch-job", *host]
    # ssh-keygen accepts what we wrote (OpenSSH format) and derives the same public key
    if shutil.which("ssh-keygen"):
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(target / "id_ed25519")], capture_output=True, text=True)
        assert derived.stdout.split()[:2] == client, derived.stderr
    before = (target / "id_ed25519").read_bytes()
    again = run_mlaunch(["keys", str(target)])
    assert again.returncode == 2 and "--force" in again.stderr
    assert (target / "id_ed25519").read_bytes() == before
    forced = run_mlaunch(["keys", "--force", str(target)])
    assert forced.returncode == 0 and (target / "id_ed25519").read_bytes() != before


def test_check_reports_mpi_tools_and_secret(tmp_path: Path) -> None:
    job = write_job(tmp_path, "mpi: {keys_dir: ssh}\n")
    os.chmod(tmp_path / "ssh" / "id_ed25519", 0o644)
    result = run_mlaunch(["check", "--engine", "mpi", str(job)], env=platform_env(0))
    if shutil.which("mpirun") and shutil.which("ssh"):
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ok: mpirun found" in result.stdout and "ok: job ssh secret" in result.stdout
    assert "warning: readable by others" in result.stdout


# ----------------------------------------------------------------------------------------
# Real local runs
# ----------------------------------------------------------------------------------------


@needs_mpi
def test_example_runs_locally_and_sums(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    job = tmp_path / "job.yaml"
    # the example's own name/code_dir/log_dir lines are replaced: a key given twice is an error
    example = (EXAMPLES / "mpi" / "job.yaml").read_text().splitlines()
    kept = [line for line in example if not line.startswith(("name:", "code_dir:", "log_dir:"))]
    job.write_text(
        "\n".join(kept) + f"\ncode_dir: {EXAMPLES / 'mpi'}\nlog_dir: {tmp_path / 'logs'}\nname: local-{os.getpid()}\n"
    )
    result = run_mlaunch(["--engine", "mpi", str(job)], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "allreduce-sum 10 world 4" in result.stdout
    assert (tmp_path / "logs" / "node0-mpirun.log").read_text().count("allreduce-sum") == 1


FAILING = """
import os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.allreduce(1)
if sys.argv[1] == "exit7" and comm.Get_rank() == 2:
    os._exit(7)
print(f"sleeping {comm.Get_rank()} {os.getpid()}", flush=True)
time.sleep(120)
"""


@needs_mpi
def test_local_rank_exit_code_is_mlaunchs(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    (tmp_path / "ranks.py").write_text(FAILING)
    job = write_job(tmp_path, "nodes: 2\nargs: [exit7]\n", keys=False, entry="ranks.py")
    (tmp_path / "ranks.py").write_text(FAILING)
    result = run_mlaunch(["--engine", "mpi", str(job)], timeout=120)
    assert result.returncode == 7, result.stderr
    assert "node 0 mpirun" in result.stderr and "exited with code 7" in result.stderr


@needs_mpi
def test_local_sigterm_stops_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py")
    job = write_job(tmp_path, "nodes: 2\nargs: [sleep]\n", keys=False, entry="ranks.py")
    (tmp_path / "ranks.py").write_text(FAILING)
    proc = subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "mpi", str(job)],
        env=clean_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = tmp_path / "output" / "logs" / "node0-mpirun.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("sleeping") == 4):
        time.sleep(0.05)
    pids = [int(p) for p in re.findall(r"sleeping \d (\d+)", log.read_text())]
    assert len(pids) == 4
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
