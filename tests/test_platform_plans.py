"""Plans for every platform input the PyTorch engine understands — no process is started.

Each case is the env and appended arguments a platform injects into one node; the plan must
give that node's processes the right ranks, world size and master.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_mlaunch

from launchers.config.job import load_job
from launchers.errors import PlatformError, UserError
from launchers.plan import LaunchPlan
from launchers.run.runner import make_plan


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text("entry: train.py\nengine: pytorch\nnodes: 2\nprocs_per_node: 2\nargs: [--lr, '0.1']\n")
    return path


def plan_for(job_file: Path, env: dict[str, str], args: list[str] | None = None, **overrides: Any) -> LaunchPlan:
    job = load_job(job_file)
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        if field:
            setattr(getattr(job, section), field, value)
        else:
            setattr(job, key, value)
    return make_plan(job, "pytorch", args or [], env)[2]


def ranks(plan: LaunchPlan) -> list[tuple[int, int, int]]:
    return [(n.index, p.rank, p.local_rank) for n in plan.nodes for p in n.processes]


def env_of(plan: LaunchPlan, rank: int) -> dict[str, str]:
    return next(p.env for p in plan.processes if p.rank == rank)


def test_local_simulation_lists_every_node(job_file: Path) -> None:
    plan = plan_for(job_file, {})
    assert plan.simulated and plan.source == "local-simulation"
    assert ranks(plan) == [(0, 0, 0), (0, 1, 1), (1, 2, 0), (1, 3, 1)]
    assert plan.world_size == 4 and plan.master_addr == "127.0.0.1"
    env = env_of(plan, 3)
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "4"
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "1" and env["NODE_RANK"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) == plan.master_port > 0
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["MLAUNCH_RESTART_COUNT"] == "0"


@pytest.mark.parametrize(
    "args",
    [
        ["--init_method", "tcp://10.0.0.1:6666", "--rank", "1", "--world_size", "2"],
        ["--init_method=tcp://10.0.0.1:6666", "--rank=1", "--world_size=2"],
        ["--data_url=s3://bucket/data", "--init_method", "tcp://10.0.0.1:6666", "--rank=1", "--world_size", "2"],
    ],
)
def test_modelarts_appended_arguments_are_node_level(job_file: Path, args: list[str]) -> None:
    plan = plan_for(job_file, {"MA_NUM_GPUS": "2"}, args)
    assert not plan.simulated and plan.source.startswith("modelarts-args")
    assert ranks(plan) == [(1, 2, 0), (1, 3, 1)]
    assert (plan.master_addr, plan.master_port, plan.world_size) == ("10.0.0.1", 6666, 4)
    proc = plan.processes[0]
    assert proc.argv[-2:] == ["--lr", "0.1"] or "--data_url=s3://bucket/data" in proc.argv
    if "--data_url=s3://bucket/data" in args:
        assert proc.argv[-3:] == ["--lr", "0.1", "--data_url=s3://bucket/data"]
    assert "--rank" not in proc.argv  # consumed by mlaunch (env style)


def test_init_method_style_passes_global_rank_and_world(job_file: Path) -> None:
    args = ["--init_method", "tcp://10.0.0.1:6666", "--rank", "1", "--world_size", "2"]
    plan = plan_for(job_file, {"MA_NUM_GPUS": "2"}, args, pytorch__style="init_method")
    assert plan.processes[1].argv[-6:] == ["--init_method", "tcp://10.0.0.1:6666", "--rank", "3", "--world_size", "4"]


def test_single_node_gets_init_method_alone(job_file: Path) -> None:
    plan = plan_for(job_file, {"MA_NUM_GPUS": "4"}, ["--init_method", "tcp://192.168.0.5:6666"])
    assert ranks(plan) == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 3, 3)]
    assert plan.nnodes == 1 and plan.master_addr == "192.168.0.5"


def test_procs_per_node_from_job_when_platform_has_no_gpus(job_file: Path) -> None:
    plan = plan_for(job_file, {"MA_NUM_GPUS": "0"}, ["--init_method", "tcp://h:1", "--rank", "0", "--world_size", "3"])
    assert plan.world_size == 6 and ranks(plan) == [(0, 0, 0), (0, 1, 1)]


def test_modelarts_env_with_worker_hosts(job_file: Path) -> None:
    hosts = "job-x-worker-0.job-x,job-x-worker-1.job-x,job-x-worker-2.job-x"
    env = {"MA_NUM_HOSTS": "3", "VC_TASK_INDEX": "2", "VC_WORKER_HOSTS": hosts, "MA_NUM_GPUS": "1"}
    plan = plan_for(job_file, env)
    assert ranks(plan) == [(2, 2, 0)]
    assert plan.master_addr == "job-x-worker-0.job-x" and plan.master_port == 29500
    assert plan.nodes[0].host == "job-x-worker-2.job-x"


def test_vk_task_index_fallback_and_vj_name_hosts(job_file: Path) -> None:
    env = {"MA_NUM_HOSTS": "2", "VK_TASK_INDEX": "1", "MA_VJ_NAME": "ma-job-abc", "MA_TASK_NAME": "worker"}
    plan = plan_for(job_file, env)
    assert plan.master_addr == "modelarts-job-abc-worker-0.modelarts-job-abc"
    assert plan.nodes[0].host == "modelarts-job-abc-worker-1.modelarts-job-abc"
    assert ranks(plan) == [(1, 2, 0), (1, 3, 1)]


def test_kubeflow_pytorchjob_env(job_file: Path) -> None:
    env = {
        "MASTER_ADDR": "pj-master-0",
        "MASTER_PORT": "23456",
        "RANK": "2",
        "PET_NODE_RANK": "2",
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "4",
        "WORLD_SIZE": "12",
    }
    plan = plan_for(job_file, env)
    assert plan.source == "kubeflow-pytorchjob"
    assert ranks(plan) == [(2, 8 + i, i) for i in range(4)]
    assert (plan.master_addr, plan.master_port, plan.world_size) == ("pj-master-0", 23456, 12)


def test_kubeflow_without_nproc_counts_pods(job_file: Path) -> None:
    env = {
        "MASTER_ADDR": "m",
        "MASTER_PORT": "1",
        "RANK": "1",
        "PET_NODE_RANK": "1",
        "PET_NNODES": "2",
        "WORLD_SIZE": "2",
    }
    plan = plan_for(job_file, env)
    assert plan.world_size == 4 and ranks(plan) == [(1, 2, 0), (1, 3, 1)]


def test_volcano_pytorch_plugin_env(job_file: Path) -> None:
    env = {
        "MASTER_ADDR": "vj-master-0.vj",
        "MASTER_PORT": "23456",
        "RANK": "1",
        "WORLD_SIZE": "3",
        "VC_TASK_INDEX": "0",
        "VC_WORKER_HOSTS": "vj-worker-0.vj,vj-worker-1.vj",
    }
    plan = plan_for(job_file, env)
    assert plan.source == "volcano-pytorch"
    assert ranks(plan) == [(1, 2, 0), (1, 3, 1)] and plan.world_size == 6


def test_mindcluster_world_size_counts_devices(job_file: Path) -> None:
    env = {
        "MINDX_TASK_ID": "uid-1",
        "MASTER_ADDR": "10.1.1.1",
        "MASTER_PORT": "2222",
        "RANK": "1",
        "WORLD_SIZE": "16",
        "LOCAL_WORLD_SIZE": "8",
        "LOCAL_RANK": "0,1,2,3,4,5,6,7",
    }
    plan = plan_for(job_file, env)
    assert plan.source == "mindcluster" and plan.nnodes == 2 and plan.world_size == 16
    assert ranks(plan) == [(1, 8 + i, i) for i in range(8)]
    assert env_of(plan, 9)["LOCAL_RANK"] == "1"


def test_plain_volcano_svc_env(job_file: Path) -> None:
    env = {"VC_WORKER_HOSTS": "a.j,b.j", "VC_WORKER_NUM": "2", "VC_TASK_INDEX": "1"}
    plan = plan_for(job_file, env)
    assert plan.source == "volcano" and plan.master_addr == "a.j" and ranks(plan) == [(1, 2, 0), (1, 3, 1)]


@pytest.mark.parametrize(
    ("env", "args", "fragment"),
    [
        (
            {"MA_NUM_HOSTS": "4"},
            ["--init_method", "tcp://h:1", "--rank", "1", "--world_size", "2"],
            "disagree on the number of nodes",
        ),
        (
            {"MA_NUM_HOSTS": "2", "VC_TASK_INDEX": "0"},
            ["--init_method", "tcp://h:1", "--rank", "1", "--world_size", "2"],
            "disagree on this node's index",
        ),
        ({}, ["--init_method", "10.0.0.1:6666"], "expected tcp://HOST:PORT"),
        ({}, ["--init_method", "tcp://h:1", "--rank", "x", "--world_size", "2"], "--rank='x' is not an integer"),
        ({}, ["--init_method", "tcp://h:1", "--rank", "2", "--world_size", "2"], "outside 0..1"),
        ({}, ["--init_method", "tcp://h:1", "--rank", "1"], "without --world_size"),
        ({"MA_NUM_HOSTS": "2"}, [], "not which one this is"),
        ({"MA_NUM_HOSTS": "two"}, [], "MA_NUM_HOSTS='two' is not an integer"),
        ({"MA_NUM_HOSTS": "3", "VC_TASK_INDEX": "0", "VC_WORKER_HOSTS": "a,b"}, [], "lists 2 hosts but MA_NUM_HOSTS=3"),
        (
            {"MINDX_TASK_ID": "x", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "12", "MASTER_ADDR": "m", "RANK": "0"},
            [],
            "not a multiple",
        ),
        (
            {
                "PET_NNODES": "2",
                "PET_NODE_RANK": "0",
                "PET_NPROC_PER_NODE": "2",
                "WORLD_SIZE": "6",
                "MASTER_ADDR": "m",
                "RANK": "0",
            },
            [],
            "WORLD_SIZE=6 fits neither",
        ),
        ({"PET_NNODES": "1:3", "PET_NODE_RANK": "0", "MASTER_ADDR": "m", "RANK": "0"}, [], "style: torchrun"),
    ],
)
def test_bad_or_contradicting_platform_inputs(
    job_file: Path, env: dict[str, str], args: list[str], fragment: str
) -> None:
    with pytest.raises(UserError) as info:
        plan_for(job_file, env, args)
    assert fragment in str(info.value)


def test_contradiction_via_cli_exits_2(job_file: Path) -> None:
    result = run_mlaunch(
        ["plan", str(job_file), "--init_method", "tcp://h:1", "--rank", "1", "--world_size", "2"],
        env=clean_env(MA_NUM_HOSTS="3"),
    )
    assert result.returncode == 2
    assert "MA_NUM_HOSTS=3" in result.stderr and "--world_size=2" in result.stderr
    assert "Traceback" not in result.stderr


def test_elastic_range_with_torchrun_style(job_file: Path) -> None:
    env = {
        "PET_NNODES": "2:3",
        "PET_NODE_RANK": "0",
        "MASTER_ADDR": "m",
        "MASTER_PORT": "29400",
        "RANK": "0",
        "PET_NPROC_PER_NODE": "2",
    }
    plan = plan_for(job_file, env, pytorch__style="torchrun")
    argv = plan.processes[0].argv
    assert "--nnodes=2:3" in argv and "--rdzv-endpoint=m:29400" in argv and "--nproc-per-node=2" in argv
    assert not any(a.startswith("--node-rank") for a in argv)
    assert "--shutdown-timeout=30" in argv  # torchrun's kill timer agrees with the grace period


def test_elastic_pytorchjob_without_master_uses_the_rendezvous_endpoint(job_file: Path) -> None:
    env = {
        "PET_NNODES": "1:4",
        "PET_RDZV_ENDPOINT": "ej-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d",
        "PET_NPROC_PER_NODE": "2",
    }
    plan = plan_for(job_file, env, pytorch__style="torchrun")
    argv = plan.processes[0].argv
    assert "--nnodes=1:4" in argv and "--rdzv-endpoint=ej-worker-0:23456" in argv


def test_torchrun_style_simulated(job_file: Path) -> None:
    plan = plan_for(job_file, {}, pytorch__style="torchrun")
    assert [p.role for p in plan.processes] == ["torchrun", "torchrun"]
    first, second = (p.argv for p in plan.processes)
    assert "--node-rank=0" in first and "--rdzv-conf=is_host=1" in first
    assert "--node-rank=1" in second and "--rdzv-conf=is_host=0" in second


def test_plan_json_shape_and_env_is_only_what_mlaunch_sets(job_file: Path) -> None:
    result = run_mlaunch(["plan", str(job_file), "--json"], env=clean_env(SOME_USER_VAR="x"))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {"engine", "world_size", "nodes"} <= set(data)
    assert data["engine"] == "pytorch" and data["world_size"] == 4
    for node in data["nodes"]:
        assert {"index", "host", "processes"} <= set(node)
        for proc in node["processes"]:
            assert {"rank", "local_rank", "argv", "env", "cwd"} <= set(proc)
            assert all(isinstance(v, str) for v in proc["env"].values())
            assert "PATH" not in proc["env"] and "SOME_USER_VAR" not in proc["env"]
            assert proc["cwd"] == str(job_file.parent)


def test_plan_accepts_platform_args_and_env_like_a_run(job_file: Path) -> None:
    result = run_mlaunch(
        [
            "plan",
            "--engine",
            "pytorch",
            str(job_file),
            "--json",
            "--init_method",
            "tcp://10.0.0.1:6666",
            "--rank",
            "1",
            "--world_size",
            "2",
        ],
        env=clean_env(MA_NUM_GPUS="2", MA_NUM_HOSTS="2", VC_TASK_INDEX="1"),
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [(p["rank"], p["local_rank"]) for n in data["nodes"] for p in n["processes"]] == [(2, 0), (3, 1)]
    assert data["nodes"][0]["index"] == 1


def test_plan_text_output_is_readable(job_file: Path) -> None:
    result = run_mlaunch(["plan", str(job_file)])
    assert result.returncode == 0
    assert "rank 3 (local 1)" in result.stdout and "env (every process):" in result.stdout


def test_simulate_flag_ignores_platform_env(job_file: Path) -> None:
    result = run_mlaunch(["plan", str(job_file), "--json", "--simulate"], env=clean_env(MA_NUM_HOSTS="9"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["simulated"] is True


def test_platform_error_types_are_user_errors() -> None:
    assert issubclass(PlatformError, UserError)
