"""Ascend engine: plans for every rank-table format and platform input, and real runs of a start file.

Rank-table mode cannot run HCCL here (no NPUs): the real runs use ``examples/ascend/check_env.py``,
a start file that checks every variable it receives against the rank table it is pointed at
(RANK_ID, RANK_SIZE, DEVICE_ID, ASCEND_DEVICE_ID, RANK_START, MA_CURRENT_HOST_IP, JOB_ID, the
per-rank working directory, the node-leader flag), for 1 and 2 simulated servers, for a
ModelArts-style per-device start, and for a converted legacy table. The MindCluster and
ModelArts env are written by hand here (there is no such platform on this machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, clean_env, run_mlaunch
from test_ranktable import LEGACY, V10, V12

from launchers.config.job import load_job
from launchers.errors import PlatformError
from launchers.plan import LaunchPlan
from launchers.platform.ascend_device import is_node_leader, per_device_start
from launchers.platform.ranktable import write_rank_table
from launchers.run.runner import make_plan

CHECK_ENV = EXAMPLES / "ascend" / "check_env.py"


def write_job(tmp_path: Path, text: str = "") -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: acjob\nengine: ascend\nentry: {CHECK_ENV}\n{text}")
    return job


def plan_for(tmp_path: Path, env: dict[str, str], job_text: str = "", args: list[str] | None = None) -> LaunchPlan:
    job = load_job(write_job(tmp_path, job_text))
    _, _, plan = make_plan(job, "ascend", args or [], env)
    return plan


def table_file(tmp_path: Path, data: dict[str, Any], name: str = "hccl.json") -> str:
    return str(write_rank_table(data, tmp_path / name))


# -- rank-table plans ---------------------------------------------------------------------


def test_simulated_plan_points_at_the_table_prepare_will_write(tmp_path: Path) -> None:
    job = write_job(tmp_path, "nodes: 2\nprocs_per_node: 2\n")
    result = run_mlaunch(["plan", "--engine", "ascend", str(job), "--json"])
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["world_size"] == 4 and plan["simulated"] is True
    procs = [p for n in plan["nodes"] for p in n["processes"]]
    table = tmp_path / "output" / "logs" / "rank_table" / "hccl_2s_4p.json"
    assert {p["env"]["RANK_TABLE_FILE"] for p in procs} == {str(table)}
    assert not table.exists()  # plan is pure: the runner's prepare step writes it
    assert [p["env"]["RANK_ID"] for p in procs] == ["0", "1", "2", "3"]
    assert [p["env"]["RANK_START"] for p in procs] == ["0", "0", "2", "2"]
    assert [p["env"]["ASCEND_DEVICE_ID"] for p in procs] == ["0", "1", "0", "1"]
    assert [p["env"]["MA_CURRENT_HOST_IP"] for p in procs] == ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"]
    assert [p["env"]["MLAUNCH_NODE_LEADER"] for p in procs] == ["1", "0", "1", "0"]
    assert procs[3]["cwd"] == str(tmp_path / "output" / "logs" / "rank_3")
    assert plan["nodes"][0]["bootstrap"][0]["name"] == "write_rank_table"


def test_v10_second_server_from_ma_current_host_ip(tmp_path: Path) -> None:
    env = {"RANK_TABLE_FILE": table_file(tmp_path, V10), "MA_CURRENT_HOST_IP": "10.0.0.2", "MA_VJ_NAME": "ma-job-42"}
    plan = plan_for(tmp_path, env, args=["--data_url", "obs://x"])
    assert plan.world_size == 4 and plan.simulated is False and plan.nnodes == 2
    assert [n.index for n in plan.nodes] == [1]
    procs = plan.processes
    assert [p.rank for p in procs] == [2, 3]
    e = procs[1].env
    assert (e["RANK_ID"], e["RANK_SIZE"], e["DEVICE_ID"], e["ASCEND_DEVICE_ID"], e["RANK_START"]) == (
        "3",
        "4",
        "1",
        "1",
        "2",
    )
    assert e["RANK_TABLE_FILE"] == env["RANK_TABLE_FILE"] and e["JOB_ID"] == "modelarts-job-42"
    assert procs[0].argv[-2:] == ["--data_url", "obs://x"]


def test_v12_server_found_by_host_ip(tmp_path: Path) -> None:
    env = {"RANK_TABLE_FILE": table_file(tmp_path, V12), "MA_CURRENT_HOST_IP": "172.16.0.111"}
    plan = plan_for(tmp_path, env)
    assert [(p.rank, p.env["MA_CURRENT_HOST_IP"], p.env["RANK_START"]) for p in plan.processes] == [(2, "node_1", "2")]


def test_legacy_table_is_converted_for_the_processes(tmp_path: Path) -> None:
    env = {"RANK_TABLE_FILE": table_file(tmp_path, LEGACY, "jobstart_hccl.json"), "MA_CURRENT_HOST_IP": "10.0.0.10"}
    plan = plan_for(tmp_path, env)
    converted = str(tmp_path / "output" / "logs" / "rank_table" / "hccl_v1.0.json")
    assert [(p.rank, p.env["DEVICE_ID"], p.env["ASCEND_DEVICE_ID"]) for p in plan.processes] == [
        (4, "4", "0"),
        (5, "5", "1"),
    ]
    assert {p.env["RANK_TABLE_FILE"] for p in plan.processes} == {converted}
    assert plan.nodes[0].bootstrap[0].params == {"path": converted, "convert_from": env["RANK_TABLE_FILE"]}
    assert any("legacy" in n for n in plan.notes)


def test_ascend_rt_visible_devices_makes_device_id_logical(tmp_path: Path) -> None:
    env = {
        "RANK_TABLE_FILE": table_file(tmp_path, LEGACY, "jobstart_hccl.json"),
        "MA_CURRENT_HOST_IP": "10.0.0.10",
        "ASCEND_RT_VISIBLE_DEVICES": "4,5",
    }
    assert [p.env["DEVICE_ID"] for p in plan_for(tmp_path, env).processes] == ["0", "1"]
    physical = plan_for(tmp_path, env, "ascend: {device_id: physical}\n")
    assert [p.env["DEVICE_ID"] for p in physical.processes] == ["4", "5"]


def test_rank_table_from_job_yaml(tmp_path: Path) -> None:
    table_file(tmp_path, V10)
    plan = plan_for(tmp_path, {"MA_CURRENT_HOST_IP": "10.0.0.1"}, "ascend: {rank_table: hccl.json}\n")
    assert [p.rank for p in plan.processes] == [0, 1]


# -- ModelArts per-device start -------------------------------------------------------------


def test_per_device_start_plans_just_that_rank(tmp_path: Path) -> None:
    base = {"RANK_TABLE_FILE": table_file(tmp_path, V10), "RANK_SIZE": "4"}
    plan = plan_for(tmp_path, {**base, "ASCEND_DEVICE_ID": "1", "RANK_ID": "3"})
    assert [(p.rank, p.local_rank, p.env["MLAUNCH_NODE_LEADER"]) for p in plan.processes] == [(3, 1, "0")]
    assert any("per-device start" in n for n in plan.notes)
    leader = plan_for(tmp_path, {**base, "ASCEND_DEVICE_ID": "0", "RANK_ID": "2"})
    assert [(p.rank, p.env["MLAUNCH_NODE_LEADER"]) for p in leader.processes] == [(2, "1")]


def test_node_leader_helper() -> None:
    assert is_node_leader({}) is True
    assert is_node_leader({"ASCEND_DEVICE_ID": "0", "RANK_ID": "8"}) is True
    assert is_node_leader({"ASCEND_DEVICE_ID": "3", "RANK_ID": "11"}) is False
    assert is_node_leader({"ASCEND_DEVICE_ID": "3"}) is True  # a single-card job sets no RANK_ID: not per-device
    assert is_node_leader({"MLAUNCH_NODE_LEADER": "0", "ASCEND_DEVICE_ID": "0", "RANK_ID": "0"}) is False
    assert per_device_start({"ASCEND_DEVICE_ID": "2", "RANK_ID": "10"}) == (2, 10)
    with pytest.raises(PlatformError, match="ASCEND_DEVICE_ID='x'"):
        per_device_start({"ASCEND_DEVICE_ID": "x", "RANK_ID": "1"})


# -- contradictions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ASCEND_DEVICE_ID": "0", "RANK_ID": "3"}, r"ASCEND_DEVICE_ID=0 but RANK_ID=3 is device #1"),
        ({"ASCEND_DEVICE_ID": "0", "RANK_ID": "9"}, r"RANK_ID=9 is not in rank table .*ranks 0\.\.3"),
        (
            {"ASCEND_DEVICE_ID": "0", "RANK_ID": "0", "MA_CURRENT_HOST_IP": "10.0.0.2"},
            r"MA_CURRENT_HOST_IP=10\.0\.0\.2 but RANK_ID=0 belongs to server '10\.0\.0\.1'",
        ),
        ({"MA_CURRENT_HOST_IP": "10.0.0.1", "RANK_SIZE": "8"}, r"RANK_SIZE=8 but rank table .* lists 4 devices"),
        ({"MA_CURRENT_HOST_IP": "10.0.0.1", "MA_NUM_HOSTS": "3"}, r"MA_NUM_HOSTS=3 but rank table .* lists 2 servers"),
        ({"MA_CURRENT_HOST_IP": "10.0.0.7"}, r"cannot tell which server .*MA_CURRENT_HOST_IP=10\.0\.0\.7"),
        ({"MA_RUN_METHOD": "torchrun"}, r"--engine pytorch"),
    ],
)
def test_contradicting_inputs_are_errors(tmp_path: Path, env: dict[str, str], message: str) -> None:
    with pytest.raises(PlatformError, match=message):
        plan_for(tmp_path, {"RANK_TABLE_FILE": table_file(tmp_path, V10), **env})


def test_job_yaml_and_env_name_different_tables(tmp_path: Path) -> None:
    env = {"RANK_TABLE_FILE": table_file(tmp_path, V10, "a.json")}
    with pytest.raises(PlatformError, match=r"ascend\.rank_table: b\.json .* RANK_TABLE_FILE=.*a\.json"):
        plan_for(tmp_path, env, "ascend: {rank_table: b.json}\n")


def test_explicit_rank_table_style_against_ma_run_method(tmp_path: Path) -> None:
    with pytest.raises(PlatformError, match=r"ascend\.style: rank_table but .* MA_RUN_METHOD=msrun"):
        plan_for(tmp_path, {"MA_RUN_METHOD": "msrun"}, "ascend: {style: rank_table}\n")


def test_bad_table_is_exit_2_without_traceback(tmp_path: Path) -> None:
    bad = table_file(tmp_path, {**V10, "server_count": "5"})
    result = run_mlaunch(["plan", "-e", "ascend", str(write_job(tmp_path))], env=clean_env(RANK_TABLE_FILE=bad))
    assert result.returncode == 2
    assert "server_count is 5 but server_list has 2" in result.stderr and "Traceback" not in result.stderr


# -- msrun / dynamic cluster plans ----------------------------------------------------------


def test_msrun_simulated_scheduler_plus_workers(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, {}, "nodes: 2\nprocs_per_node: 2\nascend: {style: msrun}\n")
    sched, *workers = plan.processes
    assert (sched.role, sched.required, sched.env["MS_ROLE"], sched.label) == (
        "scheduler",
        True,
        "MS_SCHED",
        "scheduler",
    )
    assert [w.env["MS_ROLE"] for w in workers] == ["MS_WORKER"] * 4
    assert [w.env["MS_NODE_ID"] for w in workers] == ["0", "1", "2", "3"]
    assert [w.env["DEVICE_ID"] for w in workers] == ["0", "1", "0", "1"]
    for p in plan.processes:
        assert p.env["MS_SCHED_HOST"] == "127.0.0.1" and p.env["MS_WORKER_NUM"] == "4" and p.env["RANK_SIZE"] == "4"
        assert p.env["MS_SCHED_PORT"] == str(plan.master_port)
    assert plan.world_size == 4 and len(plan.nodes[1].processes) == 2


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        (
            {"MS_ROLE": "MS_WORKER", "MS_NODE_RANK": "1", "MS_WORKER_NUM": "16", "MS_LOCAL_WORKER": "8"},
            {"scheduler": False, "ranks": list(range(8, 16))},
        ),
        (
            {"MS_ROLE": "MS_SCHED", "MS_NODE_RANK": "0", "MS_WORKER_NUM": "16", "MS_LOCAL_WORKER": "8"},
            {"scheduler": True, "ranks": list(range(8))},
        ),
        (
            {
                "MS_ROLE": "MS_SCHED",
                "MS_NODE_RANK": "0",
                "MS_WORKER_NUM": "16",
                "MS_LOCAL_WORKER": "8",
                "NPU_POD": "false",
            },
            {"scheduler": True, "ranks": []},
        ),
    ],
)
def test_msrun_from_mindcluster_env(tmp_path: Path, env: dict[str, str], expect: dict[str, Any]) -> None:
    plan = plan_for(tmp_path, {"MS_SCHED_HOST": "10.1.1.1", "MS_SCHED_PORT": "2222", **env})
    assert plan.source == "mindcluster-msrun" and plan.world_size == 16
    assert any(p.role == "scheduler" for p in plan.processes) is expect["scheduler"]
    assert [p.rank for p in plan.processes if p.role == "worker"] == expect["ranks"]
    for p in plan.processes:
        assert (p.env["MS_SCHED_HOST"], p.env["MS_SCHED_PORT"], p.env["MS_WORKER_NUM"]) == ("10.1.1.1", "2222", "16")


def test_msrun_mindcluster_errors(tmp_path: Path) -> None:
    base = {"MS_SCHED_HOST": "10.1.1.1", "MS_SCHED_PORT": "2222", "MS_ROLE": "MS_WORKER"}
    with pytest.raises(PlatformError, match=r"MS_WORKER_NUM=10 is not a multiple of MS_LOCAL_WORKER=4"):
        plan_for(tmp_path, {**base, "MS_WORKER_NUM": "10", "MS_LOCAL_WORKER": "4", "MS_NODE_RANK": "0"})
    with pytest.raises(PlatformError, match=r"MS_NODE_RANK=2 is outside 0\.\.1"):
        plan_for(tmp_path, {**base, "MS_WORKER_NUM": "8", "MS_LOCAL_WORKER": "4", "MS_NODE_RANK": "2"})
    with pytest.raises(PlatformError, match=r"MA_NUM_HOSTS=3 but MS_WORKER_NUM=8"):
        plan_for(
            tmp_path, {**base, "MS_WORKER_NUM": "8", "MS_LOCAL_WORKER": "4", "MS_NODE_RANK": "1", "MA_NUM_HOSTS": "3"}
        )


def test_msrun_from_modelarts_env(tmp_path: Path) -> None:
    env = {
        "MA_RUN_METHOD": "msrun",
        "MA_NUM_HOSTS": "2",
        "MA_NUM_GPUS": "2",
        "VC_TASK_INDEX": "1",
        "VC_WORKER_HOSTS": "10.0.0.5,10.0.0.6",
    }
    plan = plan_for(tmp_path, env)
    assert [(p.role, p.rank) for p in plan.processes] == [("worker", 2), ("worker", 3)]
    assert plan.processes[0].env["MS_SCHED_HOST"] == "10.0.0.5"
    assert plan.processes[0].env["MS_SCHED_PORT"] == "8118"
    node0 = plan_for(tmp_path, {**env, "VC_TASK_INDEX": "0"})
    assert [p.role for p in node0.processes] == ["scheduler", "worker", "worker"]


# -- real runs of a start file that checks its env ------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2])
def test_run_simulated_servers_checks_every_variable(tmp_path: Path, nodes: int) -> None:
    job = write_job(tmp_path, f"nodes: {nodes}\nprocs_per_node: 2\n")
    result = run_mlaunch([str(job)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    oks = [line for line in result.stdout.splitlines() if " ok: server " in line]
    assert len(oks) == 2 * nodes, result.stdout
    table = json.loads((tmp_path / "output" / "logs" / "rank_table" / f"hccl_{nodes}s_{2 * nodes}p.json").read_text())
    assert table["server_count"] == str(nodes)
    saved = json.loads((tmp_path / "output" / "logs" / f"rank_{2 * nodes - 1}" / "env.json").read_text())
    assert saved["RANK_ID"] == str(2 * nodes - 1) and saved["JOB_ID"] == "acjob"


def test_run_per_device_copies_like_modelarts(tmp_path: Path) -> None:
    """ModelArts runs the start file once per device; each mlaunch copy must run just its rank."""
    data = json.loads(json.dumps(V10))
    data["server_list"][1]["server_id"] = "127.0.0.1"  # this machine is the second server
    table = table_file(tmp_path, data)
    job = write_job(tmp_path)
    outputs = []
    for device, rank in ((0, 2), (1, 3)):
        env = clean_env(RANK_TABLE_FILE=table, ASCEND_DEVICE_ID=str(device), RANK_ID=str(rank), RANK_SIZE="4")
        result = run_mlaunch([str(job)], env=env, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        outputs.append(result.stdout)
    assert [o.count(" ok: server 127.0.0.1") for o in outputs] == [1, 1]
    assert "rank 2 ok" in outputs[0] and "leader=1" in outputs[0]
    assert "rank 3 ok" in outputs[1] and "leader=0" in outputs[1]


def test_run_with_legacy_table_uses_the_converted_copy(tmp_path: Path) -> None:
    table = table_file(tmp_path, LEGACY, "jobstart_hccl.json")
    result = run_mlaunch(
        [str(write_job(tmp_path))], env=clean_env(RANK_TABLE_FILE=table, MA_CURRENT_HOST_IP="10.0.0.3"), timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 2 ok: server 10.0.0.3 device 0" in result.stdout and "rank 3 ok" in result.stdout
    converted = json.loads((tmp_path / "output" / "logs" / "rank_table" / "hccl_v1.0.json").read_text())
    assert converted["version"] == "1.0" and converted["server_count"] == "3"


def test_the_checker_catches_a_wrong_variable(tmp_path: Path) -> None:
    """The start file above is only evidence if it can fail: give it one wrong value."""
    table = table_file(tmp_path, V10)
    env = {
        **clean_env(),
        "RANK_TABLE_FILE": table,
        "RANK_SIZE": "4",
        "RANK_ID": "3",
        "MA_CURRENT_HOST_IP": "10.0.0.2",
        "ASCEND_DEVICE_ID": "1",
        "DEVICE_ID": "1",
        "RANK_START": "3",  # wrong: the server's first rank is 2
        "JOB_ID": "j",
        "MLAUNCH_NODE_LEADER": "0",
        "MLAUNCH_RANK_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, str(CHECK_ENV)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1 and "RANK_START=3 but the server's first rank is 2" in result.stdout


def test_this_server_found_by_this_machines_own_address(tmp_path: Path) -> None:
    """No MA_CURRENT_HOST_IP: the server whose server_id is one of this machine's addresses (loopback here)."""
    data = json.loads(json.dumps(V10))
    data["server_list"][0]["server_id"] = "192.0.2.250"  # TEST-NET: never this machine
    data["server_list"][1]["server_id"] = "127.0.0.1"
    plan = plan_for(tmp_path, {"RANK_TABLE_FILE": table_file(tmp_path, data)})
    assert [p.rank for p in plan.processes] == [2, 3] and plan.nodes[0].host == "127.0.0.1"


def test_simulate_flag_ignores_the_platform_table(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "nodes: 1\nprocs_per_node: 3\n"))
    env = {"RANK_TABLE_FILE": table_file(tmp_path, V10), "MA_CURRENT_HOST_IP": "10.0.0.2"}
    plan = make_plan(job, "ascend", [], env, simulate=True)[2]
    assert plan.simulated and [p.env["RANK_SIZE"] for p in plan.processes] == ["3", "3", "3"]
