"""The PyTorch engine end to end: real torch.distributed (gloo, CPU) across real processes.

Each test writes its own job.yaml in a temporary directory pointing at the example's
train.py, so logs and checkpoints never collide between tests.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch

from launchers.platform.cluster import free_port

pytestmark = needs_torch

TRAIN = EXAMPLES / "pytorch" / "train.py"
FAULTY = ROOT / "tests" / "scripts" / "ddp_faulty.py"


def job_yaml(tmp_path: Path, *, entry: Path = TRAIN, nodes: int = 2, procs: int = 2, extra: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: e2e\nengine: pytorch\nentry: {entry}\nargs: ['--steps', '12']\nnodes: {nodes}\n"
        f"procs_per_node: {procs}\nenv: {{GLOO_SOCKET_IFNAME: lo}}\nlog_dir: {tmp_path / 'logs'}\n"
        f"checkpoint: {{dir: {tmp_path / 'ckpt'}, grace_period: 10s}}\n{extra}"
    )
    return path


def final_checksum(stdout: str) -> str:
    found = re.findall(r"final-checksum ([0-9a-f]+)", stdout)
    assert len(found) == 1, stdout
    return found[0]


def losses(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"step \d+ loss ([0-9.]+)", stdout)]


@pytest.fixture(scope="module")
def reference_checksum(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A plain 2 × 2 local-simulation run: the result every other launch must reproduce."""
    tmp = tmp_path_factory.mktemp("reference")
    result = run_mlaunch(["--engine", "pytorch", str(job_yaml(tmp))], timeout=300)
    assert result.returncode == 0, result.stderr
    return final_checksum(result.stdout)


def test_local_simulation_2x2_trains_and_ranks_agree(tmp_path: Path) -> None:
    result = run_mlaunch(["--engine", "pytorch", str(job_yaml(tmp_path))], timeout=300)
    assert result.returncode == 0, result.stderr
    loss = losses(result.stdout)
    assert len(loss) == 12 and loss[-1] < loss[0] / 4
    sums = re.findall(r"\[node (\d) rank (\d)\] param-checksum ([0-9a-f]+)", result.stdout)
    assert sorted((n, r) for n, r, _ in sums) == [("0", "0"), ("0", "1"), ("1", "2"), ("1", "3")]
    assert len({s for _, _, s in sums}) == 1
    assert final_checksum(result.stdout) == sums[0][2]
    for rank in range(4):
        assert "param-checksum" in (tmp_path / "logs" / f"rank{rank}.log").read_text()


@pytest.mark.parametrize("style", ["env", "init_method"])
def test_modelarts_appended_arguments_two_nodes(tmp_path: Path, reference_checksum: str, style: str) -> None:
    """Two mlaunch processes, each one 'platform node' given --init_method/--rank/--world_size as ModelArts does."""
    job = job_yaml(tmp_path, extra=f"pytorch: {{style: {style}}}\n")
    port = free_port()
    nodes = []
    for node in range(2):
        args = [
            "--engine",
            "pytorch",
            str(job),
            "--init_method",
            f"tcp://127.0.0.1:{port}",
            f"--rank={node}",
            "--world_size",
            "2",
            "--data_url=/cache/data",
        ]
        nodes.append(
            subprocess.Popen(
                [*mlaunch_cmd(), *args],
                env=clean_env(MA_NUM_GPUS="2"),
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    outputs = [p.communicate(timeout=300) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs[0][1] + outputs[1][1]
    assert final_checksum(outputs[0][0]) == reference_checksum
    assert "[rank 2] param-checksum" in outputs[1][0]  # node 1 runs global ranks 2 and 3


def test_kill_minus_nine_of_one_rank_tears_down_and_reports(tmp_path: Path) -> None:
    job = job_yaml(tmp_path, entry=FAULTY)
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=clean_env(FAULT_RANK="1", FAULT_STEP="3"), timeout=300)
    assert result.returncode == 137, result.stderr
    assert re.search(r"job failed: node 0 rank 1 \(pid \d+\) was killed by SIGKILL \(exit code 137\)", result.stderr)
    assert "final-checksum" not in result.stdout


def test_restart_after_kill_then_success(tmp_path: Path) -> None:
    job = job_yaml(tmp_path, entry=FAULTY, extra="restart: {max_restarts: 1, backoff: 0.1s}\n")
    env = clean_env(FAULT_RANK="2", FAULT_STEP="2", FAULT_ONCE="1")
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "restarting the group (1/1)" in result.stderr
    assert re.search(r"final-checksum [0-9a-f]+", result.stdout)


@pytest.mark.slow
def test_torchrun_style_two_simulated_nodes(tmp_path: Path, reference_checksum: str) -> None:
    job = job_yaml(tmp_path, extra="pytorch: {style: torchrun}\n")
    result = run_mlaunch(["--engine", "pytorch", str(job)], timeout=300)
    assert result.returncode == 0, result.stderr
    assert final_checksum(result.stdout) == reference_checksum
