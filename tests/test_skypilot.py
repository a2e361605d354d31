"""SkyPilot: the plan each node of a multi-node task gets from SkyPilot's env alone.

SkyPilot itself cannot run here; its documented run-section env (``SKYPILOT_NODE_RANK``,
``SKYPILOT_NODE_IPS`` one IP per line, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NUM_GPUS_PER_NODE``) is
written by hand per node, and the real ``mlaunch plan --json`` plans it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_mlaunch

IPS = ["10.0.0.5", "10.0.0.7", "10.0.0.6"]


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text("name: sky\nentry: train.py\nengine: pytorch\nnodes: 3\nprocs_per_node: 1\n")
    return path


def sky_env(rank: int, ips: list[str] = IPS, gpus: int = 2, trailing: str = "\n") -> dict[str, str]:
    return {
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": "\n".join(ips) + trailing,
        "SKYPILOT_NUM_NODES": str(len(ips)),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus),
    }


def plan(job_file: Path, env: dict[str, str], *args: str) -> Any:
    result = run_mlaunch(["plan", "--json", str(job_file), *args], env=clean_env(**env), timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_every_node_plans_its_share_with_the_first_ip_as_master(job_file: Path) -> None:
    plans = [plan(job_file, sky_env(rank)) for rank in range(len(IPS))]
    ranks = sorted(p["rank"] for pl in plans for node in pl["nodes"] for p in node["processes"])
    assert ranks == list(range(6))  # 3 nodes × SKYPILOT_NUM_GPUS_PER_NODE=2
    for rank, pl in enumerate(plans):
        assert pl["source"] == "skypilot" and pl["world_size"] == 6
        assert (pl["master_addr"], pl["master_port"]) == ("10.0.0.5", 29500)
        (node,) = pl["nodes"]
        assert node["index"] == rank and node["host"] == IPS[rank]
        for proc in node["processes"]:
            assert proc["env"]["MASTER_ADDR"] == "10.0.0.5" and proc["env"]["NODE_RANK"] == str(rank)


def test_no_gpus_means_job_yaml_processes_and_its_port(job_file: Path) -> None:
    job_file.write_text(job_file.read_text() + "pytorch: {master_port: 8008}\n")
    pl = plan(job_file, sky_env(1, gpus=0, trailing=""))
    assert pl["world_size"] == 3 and pl["master_port"] == 8008
    assert [p["rank"] for p in pl["nodes"][0]["processes"]] == [1]


def test_single_node_task(job_file: Path) -> None:
    pl = plan(job_file, sky_env(0, ips=["10.1.2.3"], gpus=4))
    assert pl["source"] == "skypilot" and pl["world_size"] == 4 and pl["master_addr"] == "10.1.2.3"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SKYPILOT_NUM_NODES": "2"}, "SKYPILOT_NUM_NODES=2 says 2, but SKYPILOT_NODE_IPS lists 3 addresses"),
        ({"SKYPILOT_NODE_RANK": "3"}, "this node's index 3 (SKYPILOT_NODE_RANK=3 (skypilot)) is outside 0..2"),
        ({"SKYPILOT_NODE_RANK": "x"}, "SKYPILOT_NODE_RANK='x' is not an integer"),
        ({"SKYPILOT_NODE_IPS": "10.0.0.5\n\n10.0.0.6\n"}, "SKYPILOT_NODE_IPS='10.0.0.5\\n\\n10.0.0.6\\n' is not one"),
        ({"SKYPILOT_NODE_IPS": "10.0.0.5 10.0.0.7"}, "is not one address per line"),
        ({"SKYPILOT_NUM_GPUS_PER_NODE": "1.5"}, "SKYPILOT_NUM_GPUS_PER_NODE='1.5' is not an integer"),
        ({"MASTER_ADDR": "10.9.9.9", "RANK": "0", "WORLD_SIZE": "2"}, "platform inputs disagree on the number of"),
    ],
)
def test_bad_or_contradicting_env_is_a_clear_error(job_file: Path, env: dict[str, str], message: str) -> None:
    result = run_mlaunch(["plan", str(job_file)], env=clean_env(**{**sky_env(1), **env}), timeout=60)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_appended_arguments_must_agree_with_skypilot(job_file: Path) -> None:
    """A fact stated by two inputs must agree; the message names both."""
    args = ["--", "--init_method", "tcp://10.0.0.5:6666", "--rank", "2", "--world_size", "3"]
    result = run_mlaunch(["plan", str(job_file), *args], env=clean_env(**sky_env(1)), timeout=60)
    assert result.returncode == 2
    assert "--rank" in result.stderr and "SKYPILOT_NODE_RANK=1 (skypilot)" in result.stderr, result.stderr
