"""`mlaunch sbatch` under a real Slurm: slurmctld + two slurmd on network-namespace hosts.

The generated script is submitted with ``sbatch`` for 2 nodes × 2 processes of the PyTorch
example: Slurm starts the batch script on node01, its ``srun`` starts one mlaunch per node, each
mlaunch reads SLURM_* (node list ``node[01-02]``, its node id) and runs its two ranks of gloo DDP.

1. The job ends COMPLETED with the same ``final-checksum`` as the local simulation.
2. ``scancel --batch --signal=USR1`` (what ``--signal=B:USR1@N`` sends before the time limit) while
   it trains: the script turns it into SIGTERM for every node's mlaunch, the ranks commit a dying
   checkpoint and exit 143, the script requeues the job (``scontrol requeue``), Slurm starts it
   again (Restarts=1), it resumes from that checkpoint and ends with the same checksum.
3. A rank failing with its own code (7) ends the job FAILED with exit code 7, not requeued.

Slurm holds a requeued job until its old credential expires (``cred_expire``, 120 s by default;
the test cluster sets 10 s, see slurm_cluster.py). The example runs with its 2 DataLoader workers
per rank: Slurm's signals (scancel, time limit, preemption — and so the script's SIGTERM) reach
*every* process of the step, workers included, which ``ResumableLoader``'s ``StopSignalShield``
makes them ignore, so the ranks still stop at a step boundary and save.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, clean_env, needs_torch, run_mlaunch
from netns import netns_unavailable_reason
from slurm_cluster import SlurmCluster, slurm_unavailable_reason

pytestmark = [needs_torch, pytest.mark.netns, pytest.mark.slow]

STEPS = 300  # long enough (~15 s of steps on two cores) to signal it while it trains
ARGS = f"['--steps', '{STEPS}']"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = netns_unavailable_reason() or slurm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    slurm = SlurmCluster(2, tmp_path_factory.mktemp("slurm"))
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The local simulation's final checksum (2 × 2 on loopback, same steps and seed)."""
    tmp = tmp_path_factory.mktemp("local")
    job = tmp / "job.yaml"
    job.write_text(
        f"name: ddp-local\nengine: pytorch\nentry: train.py\ncode_dir: {EXAMPLES / 'pytorch'}\nargs: {ARGS}\n"
        f"nodes: 2\nprocs_per_node: 2\nenv: {{GLOO_SOCKET_IFNAME: lo}}\nlog_dir: {tmp / 'logs'}\n"
        f"checkpoint: {{dir: {tmp / 'ckpt'}, grace_period: 10s}}\n"
    )
    result = run_mlaunch(["--engine", "pytorch", str(job)], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return final_checksum(result.stdout)


def final_checksum(output: str) -> str:
    found = re.findall(r"final-checksum ([0-9a-f]+)", output)
    assert len(found) == 1, output
    return found[0]


def mlaunch_wrapper(tmp: Path) -> Path:
    """The mlaunch the nodes run: this interpreter's, with this checkout importable."""
    wrapper = tmp / "mlaunch"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} -m launchers "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def submit(cluster: SlurmCluster, tmp: Path, entry: str, code_dir: Path, args: str) -> tuple[str, Path]:
    """Write job.yaml, generate job.sbatch with `mlaunch sbatch`, sbatch it; (job id, its output file)."""
    job = tmp / "job.yaml"
    job.write_text(
        f"name: ddp-slurm\nengine: pytorch\nentry: {entry}\ncode_dir: {code_dir}\nargs: {args}\nnodes: 2\n"
        f"procs_per_node: 2\nlog_dir: {tmp / 'logs'}\ncheckpoint: {{dir: {tmp / 'ckpt'}, grace_period: 10s}}\n"
        f"slurm:\n  mlaunch: {mlaunch_wrapper(tmp)}\n  time: 30m\n  extra: [--output={tmp}/slurm-%j.out]\n"
    )
    script = tmp / "job.sbatch"
    generated = run_mlaunch(["sbatch", str(job), "-o", str(script)], env=clean_env(), timeout=60)
    assert generated.returncode == 0, generated.stderr
    submitted = cluster.run("sbatch", "--parsable", str(script))
    assert submitted.returncode == 0, submitted.stderr + cluster.logs()
    job_id = submitted.stdout.strip().split(";")[0]
    return job_id, tmp / f"slurm-{job_id}.out"


def test_sbatch_two_nodes_trains_to_the_local_checksum(cluster: SlurmCluster, reference: str, tmp_path: Path) -> None:
    job_id, output = submit(cluster, tmp_path, "train.py", EXAMPLES / "pytorch", ARGS)
    info = cluster.wait_job(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=300)
    text = output.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text
    assert info["NodeList"] == "node[01-02]" and info["Restarts"] == "0"
    assert text.count("(platform: slurm)") == 2 and text.count("master node01:29500") == 2, text
    assert final_checksum(text) == reference


def wait_for(path: Path, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not in {path} after {timeout}s:\n{text}")


def test_usr1_stops_every_node_gracefully_requeues_and_resumes_to_the_same_checksum(
    cluster: SlurmCluster, reference: str, tmp_path: Path
) -> None:
    job_id, output = submit(cluster, tmp_path, "train.py", EXAMPLES / "pytorch", ARGS)
    wait_for(output, r"\[rank 0\] step 40 loss", timeout=180)
    signalled = cluster.run("scancel", "--batch", "--signal=USR1", job_id)
    assert signalled.returncode == 0, signalled.stderr

    info = cluster.wait_job(job_id, ("PENDING", "COMPLETED", "FAILED", "CANCELLED"), timeout=120)
    first = output.read_text()
    assert info["JobState"] == "PENDING" and info["Restarts"] == "1", (info, first)
    assert "SIGUSR1 from Slurm" in first
    assert first.count("stopped by SIGTERM; exit code 143") == 2, first  # both nodes' mlaunch
    assert "while stopping" not in first  # every rank saved and exited 143 itself
    assert f"mlaunch exited 143: requeueing job {job_id} (restart 1 of 3)" in first
    stopped_at = max(int(s) for s in re.findall(r"\[rank 0\] step (\d+) loss", first))
    assert 40 <= stopped_at < STEPS - 1, first

    info = cluster.wait_job(job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout=300)
    text = output.read_text()  # --open-mode=append: both runs
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, text)
    resumed = re.findall(r"resumed from step (\d+)", text)
    assert resumed and int(resumed[0]) in (stopped_at, stopped_at + 1), text  # the dying checkpoint's step
    assert "restart 1:" in text  # the second run saw SLURM_RESTART_COUNT=1
    assert final_checksum(text) == reference


def test_a_rank_failing_with_its_own_code_fails_the_job_without_requeue(cluster: SlurmCluster, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "fail.py").write_text("import os, sys\nsys.exit(7 if os.environ['RANK'] == '3' else 0)\n")
    job_id, output = submit(cluster, tmp_path, "fail.py", code, "[]")
    info = cluster.wait_job(job_id, ("COMPLETED", "FAILED", "CANCELLED"), timeout=120)
    text = output.read_text()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "7:0" and info["Restarts"] == "0", (info, text)
    assert "mlaunch exited 7: the job failed" in text and "requeueing" not in text
