"""Faulty namespace hosts for the health-check tests and benchmark: a rate-limited link, a starved CPU.

Both are real kernel mechanisms (``../shared/reference/test-infrastructure.md`` §9):

- a slow link: a token bucket (``tc qdisc … tbf rate 20mbit``) on the host's ``eth0`` inside its
  namespace, so everything the host sends is limited (netem does not exist in this kernel);
- a starved CPU: a cgroup v1 ``cpu`` group with ``cpu.cfs_quota_us`` 15 % of a period. The
  process joins it *before* ``ip netns exec`` (which remounts /sys), through ``preexec_fn``;
  every child (torch, gloo threads) inherits it. cgroup v2 (``cpu.max``) is used where v1 is absent.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from conftest import ROOT, clean_env, mlaunch_cmd
from netns import IP, Host

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


def slow_link(host: Host, rate: str = "20mbit") -> None:
    subprocess.run(
        [IP, "netns", "exec", host.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate]
        + ["burst", "32kbit", "latency", "400ms"],
        check=True,
        capture_output=True,
        timeout=10,
    )


@contextlib.contextmanager
def starved_cgroup(percent: int = 15) -> Iterator[Path]:
    """A cpu cgroup limited to ``percent`` % of one CPU; yields its ``cgroup.procs``; removed afterwards."""
    name = f"mlhealth-{secrets.token_hex(3)}"
    if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
        group = CGROUP_V1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(percent * 1000))
    else:
        group = CGROUP_V2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{percent * 1000} 100000")
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(100):  # the group can go only once its processes are gone
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.05)


def join(procs_file: Path) -> Callable[[], None]:
    def preexec() -> None:
        procs_file.write_text(str(os.getpid()))

    return preexec


def write_job(tmp: Path, nodes: int, health: str) -> Path:
    """A job whose training only leaves a marker file (so a test can tell that nothing trained)."""
    (tmp / "train.py").write_text(
        "import os, pathlib\npathlib.Path(os.environ['MARKER_DIR'], 'trained-' + os.environ['RANK']).touch()\n"
    )
    job = tmp / "job.yaml"
    job.write_text(
        f"name: health\nengine: pytorch\nentry: {tmp / 'train.py'}\nnodes: {nodes}\nprocs_per_node: 1\n"
        f"log_dir: {tmp / 'logs'}\ncheckpoint: {{dir: {tmp / 'ckpt'}}}\nmonitor: {{node_timeout: 60s}}\n"
        f"env: {{MARKER_DIR: '{tmp}'}}\nhealth_check: {health}\n"
    )
    return job


def start(
    hosts: list[Host], job: Path, command: list[str], starved: dict[int, Path] | None = None
) -> list[subprocess.Popen[str]]:
    """One mlaunch per host the ModelArts way; hosts in ``starved`` join that cgroup first."""
    started = []
    for host in hosts:
        env = clean_env(
            MA_NUM_GPUS="1",
            MA_NUM_HOSTS=str(len(hosts)),
            VC_TASK_INDEX=str(host.index),
            VC_WORKER_HOSTS=",".join(h.name for h in hosts),
            GLOO_SOCKET_IFNAME="eth0",
        )
        argv = [*mlaunch_cmd(), *command, "--engine", "pytorch", str(job)]
        argv += ["--init_method", f"tcp://{hosts[0].name}:6666", "--rank", str(host.index)]
        argv += ["--world_size", str(len(hosts))]
        procs_file = (starved or {}).get(host.index)
        preexec = join(procs_file) if procs_file else None
        started.append(
            host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec)
        )
    return started


def finish(procs: list[subprocess.Popen[str]], timeout: float = 180) -> list[tuple[int, str, str]]:
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        results.append((proc.returncode, out, err))
    return results
