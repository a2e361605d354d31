"""The PyTorch engine across two real hosts (network namespaces), started the ModelArts way.

Each host runs its own ``mlaunch --engine pytorch job.yaml --init_method tcp://HOST0:PORT
--rank I --world_size 2`` with ``MA_NUM_GPUS=2`` and ``GLOO_SOCKET_IFNAME=eth0``: 2 hosts × 2
processes of the example's gloo DDP training. Its ``final-checksum`` must equal the single-host
local simulation (2 × 2 on loopback) bit for bit — same world size, same seed, same data.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch
from netns import Host, NetnsHosts, communicate_all, netns_unavailable_reason

# About 30 s on two cores (eight torch processes): part of the slow suite, which CI runs.
pytestmark = [needs_torch, pytest.mark.netns, pytest.mark.slow]

STEPS = 12


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with NetnsHosts(2) as net:
        yield net.hosts


def job_yaml(tmp_path: Path, env: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: ddp-hosts\nengine: pytorch\nentry: train.py\ncode_dir: {EXAMPLES / 'pytorch'}\n"
        f"args: ['--steps', '{STEPS}']\nnodes: 2\nprocs_per_node: 2\n{env}"
        f"log_dir: {tmp_path / 'logs'}\ncheckpoint: {{dir: {tmp_path / 'ckpt'}, grace_period: 10s}}\n"
    )
    return path


def final_checksum(output: str) -> str:
    found = re.findall(r"final-checksum ([0-9a-f]+)", output)
    assert len(found) == 1, output
    return found[0]


def test_two_hosts_from_modelarts_args_match_the_local_run(tmp_path: Path, hosts: list[Host]) -> None:
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    local = run_mlaunch(["--engine", "pytorch", str(job_yaml(local_dir, "env: {GLOO_SOCKET_IFNAME: lo}\n"))])
    assert local.returncode == 0, local.stderr
    reference = final_checksum(local.stdout)

    job = job_yaml(tmp_path, "")  # the interface comes from each host's env, as on the platform
    procs = []
    for host in hosts:
        env = clean_env(
            MA_NUM_GPUS="2",
            MA_NUM_HOSTS="2",
            VC_TASK_INDEX=str(host.index),
            VC_WORKER_HOSTS=",".join(h.name for h in hosts),
            GLOO_SOCKET_IFNAME="eth0",
        )
        argv = [*mlaunch_cmd(), "--engine", "pytorch", str(job), "--init_method", f"tcp://{hosts[0].name}:6666"]
        argv += ["--rank", str(host.index), "--world_size", "2", "--data_url", "obs://bucket/data"]
        procs.append(host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = communicate_all(procs, 240)
    dump = "\n".join(f"--- host {i} exit {rc}\n{out}\n{err}" for i, (rc, out, err) in enumerate(outputs))
    assert [rc for rc, _, _ in outputs] == [0, 0], dump
    assert final_checksum(outputs[0][1]) == reference, dump
    # Ranks 0-1 trained on host 0 and ranks 2-3 on host 1, with node-level ModelArts args.
    assert sorted(re.findall(r"\[rank (\d)\] param-checksum", outputs[0][1])) == ["0", "1"]
    assert sorted(re.findall(r"\[rank (\d)\] param-checksum", outputs[1][1])) == ["2", "3"]
    assert "platform: modelarts-args" in outputs[1][2]
