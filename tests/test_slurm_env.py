"""Slurm: the plan each node gets from the env slurmd gives an ``srun`` task (or the batch script).

The env is what slurmd 22.05 sets (measured with the real daemons of test_slurm_real.py: a step
has ``SLURM_STEP_ID``, ``SLURM_STEP_NODELIST``, ``SLURM_STEP_NUM_NODES``, ``SLURM_STEP_NUM_TASKS``;
the batch script has none of them), written here per node so every combination and every bad
value is planned by the real detection code, in-process and through the CLI (exit 2, no traceback).
Node lists are also checked against ``scontrol show hostnames`` when Slurm is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cli_inprocess import run_cli
from conftest import clean_env
from test_platform_plans import env_of, plan_for, ranks

from launchers.config.job import load_job
from launchers.errors import PlatformError
from launchers.plan import LaunchPlan
from launchers.platform.cluster import Cluster
from launchers.platform.slurm_env import expand_nodelist
from launchers.run.runner import make_plan


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text("entry: train.py\nengine: pytorch\nnodes: 2\nprocs_per_node: 2\n")
    return path


def planned(job_file: Path, env: dict[str, str], **overrides: object) -> tuple[Cluster, LaunchPlan]:
    """The cluster detection saw and the plan, for a job.yaml with ``section__field`` overrides."""
    job = load_job(job_file)
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        setattr(getattr(job, section), field, value)
    _, cluster, plan = make_plan(job, "pytorch", [], env)
    return cluster, plan


def step_env(nodelist: str, hosts: list[str], node: int, **extra: str) -> dict[str, str]:
    """One task of `srun --ntasks-per-node=1` on node ``node``, as slurmd sets it."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NNODES": str(len(hosts)),
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(len(hosts)),
        "SLURM_STEP_NUM_TASKS": str(len(hosts)),
        "SLURM_NTASKS": str(len(hosts)),
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURMD_NODENAME": hosts[node],
        "SLURM_CPUS_ON_NODE": "2",
    }
    env.update(extra)
    return {k: v for k, v in env.items() if v != "<unset>"}


NODELISTS = [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("n[001-003]-ib", ["n001-ib", "n002-ib", "n003-ib"]),
    ("gpu-[8-9]x[1-2]", ["gpu-8x1", "gpu-8x2", "gpu-9x1", "gpu-9x2"]),
    ("single", ["single"]),
]


@pytest.mark.parametrize(("nodelist", "hosts"), NODELISTS)
def test_node_lists_expand_as_slurm_does(tmp_path: Path, nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist, "SLURM_JOB_NODELIST") == hosts
    scontrol = shutil.which("scontrol")
    if scontrol:  # Slurm's own expansion: no daemon, but a slurm.conf to read
        conf = tmp_path / "slurm.conf"
        conf.write_text("ClusterName=expand\nSlurmctldHost=localhost\n")
        out = subprocess.run(
            [scontrol, "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            env=clean_env(SLURM_CONF=str(conf)),
        )
        if nodelist == "n[001-003]-ib":  # measured: Slurm 22.05 says "Invalid hostlist" (no suffix after [])
            assert not out.stdout.split() and "Invalid hostlist" in out.stderr  # with exit status 0
        else:
            assert out.stdout.split() == hosts, out.stderr


@pytest.mark.parametrize(("nodelist", "hosts"), NODELISTS[:3])
def test_every_node_plans_its_share_once_with_the_first_host_as_master(
    job_file: Path, nodelist: str, hosts: list[str]
) -> None:
    seen = []
    for node in range(len(hosts)):
        cluster, plan = planned(job_file, step_env(nodelist, hosts, node))
        assert cluster.source == "slurm"
        assert (cluster.master_addr, cluster.master_port) == (hosts[0], 29500)
        assert cluster.hosts == hosts and plan.world_size == 2 * len(hosts)
        (mine,) = plan.nodes
        assert mine.index == node
        seen += [r for (_, r, _) in ranks(plan)]
        assert env_of(plan, 2 * node)["MASTER_ADDR"] == hosts[0]
    assert sorted(seen) == list(range(2 * len(hosts)))  # every rank exactly once across the nodes


def test_gpus_on_node_set_processes_per_node_cpus_never_do(job_file: Path) -> None:
    hosts = ["node01", "node02"]
    gpu_cluster, gpus = planned(
        job_file, step_env("node[01-02]", hosts, 1, SLURM_GPUS_ON_NODE="4", SLURM_CPUS_ON_NODE="64")
    )
    assert gpu_cluster.procs_per_node == 4 and gpus.world_size == 8
    assert [r for (_, r, _) in ranks(gpus)] == [4, 5, 6, 7]
    assert any("procs_per_node: 2" in note for note in gpu_cluster.notes)  # job.yaml overruled, said so
    cpu_cluster, _ = planned(
        job_file, step_env("node[01-02]", hosts, 1, SLURM_CPUS_ON_NODE="64", SLURM_GPUS_ON_NODE="0")
    )
    assert cpu_cluster.procs_per_node == 2  # job.yaml's procs_per_node: cores are not ranks


def test_single_node_batch_script_without_srun_is_fine(job_file: Path) -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node05", "SLURM_NNODES": "1", "SLURM_NODEID": "0"}
    # the allocation's tasks (#SBATCH --ntasks-per-node=8): the script itself still runs mlaunch once
    env |= {"SLURM_NTASKS_PER_NODE": "8", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"}
    cluster, _ = planned(job_file, env)
    assert cluster.source == "slurm" and cluster.nnodes == 1 and cluster.master_addr == "node05"


def test_step_nodelist_wins_over_the_jobs(job_file: Path) -> None:
    """A step on part of the allocation: its own node list and count, not the job's."""
    env = step_env("node[02-03]", ["node02", "node03"], 0, SLURM_JOB_NODELIST="node[01-04]", SLURM_NNODES="4")
    env["SLURM_NNODES"] = "4"
    cluster, _ = planned(job_file, env)
    assert cluster.hosts == ["node02", "node03"] and cluster.master_addr == "node02"


def test_job_master_port_and_user_master_addr_agree_or_fail(job_file: Path) -> None:
    hosts = ["node01", "node02"]
    cluster, _ = planned(job_file, step_env("node[01-02]", hosts, 0), pytorch__master_port=6000)
    assert cluster.master_port == 6000
    # a torch-style env exported by a hand-written batch script wins, but numbers must agree
    agree = step_env("node[01-02]", hosts, 1, MASTER_ADDR="node01", RANK="1", WORLD_SIZE="2")
    assert planned(job_file, agree)[0].node_rank == 1
    clash = step_env("node[01-02]", hosts, 1, MASTER_ADDR="node01", RANK="1", WORLD_SIZE="3")
    with pytest.raises(
        PlatformError, match="WORLD_SIZE=3.*SLURM_STEP_NUM_NODES=2|SLURM_STEP_NUM_NODES=2.*WORLD_SIZE=3"
    ):
        plan_for(job_file, clash)


HOSTS2 = ["node01", "node02"]
BAD = [
    ({"SLURM_STEP_NODELIST": "node[01-02", "SLURM_JOB_NODELIST": "node[01-02"}, "not a Slurm host list"),
    ({"SLURM_STEP_NODELIST": "node[02-01]"}, "not a Slurm host list"),
    ({"SLURM_STEP_NODELIST": ""}, "is empty"),
    ({"SLURM_STEP_NODELIST": "node01,node01"}, "names host node01 twice"),
    ({"SLURM_STEP_NODELIST": "n[0-999999999]"}, "names 1,000,000,000 hosts"),
    ({"SLURM_STEP_NODELIST": "<unset>", "SLURM_JOB_NODELIST": "<unset>"}, "no node list"),
    ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES=3 but SLURM_STEP_NODELIST='node[01-02]' names 2 hosts"),
    ({"SLURM_STEP_NUM_NODES": "two"}, "SLURM_STEP_NUM_NODES"),
    ({"SLURM_NODEID": "2", "SLURM_PROCID": "2", "SLURMD_NODENAME": "<unset>"}, "outside 0..1"),
    ({"SLURM_NODEID": "-1"}, "SLURM_NODEID"),
    ({"SLURM_NODEID": "<unset>", "SLURM_PROCID": "<unset>"}, "not which one this is"),
    ({"SLURM_PROCID": "3"}, "SLURM_PROCID=3 differs from SLURM_NODEID=1"),
    ({"SLURM_NTASKS_PER_NODE": "4"}, "SLURM_NTASKS_PER_NODE=4: 4 mlaunch per node"),
    ({"SLURM_STEP_NUM_TASKS": "8"}, "SLURM_STEP_NUM_TASKS=8 tasks on 2 nodes"),
    ({"SLURMD_NODENAME": "node07"}, "SLURMD_NODENAME=node07 but SLURM_NODEID=1 is node02"),
    ({"SLURM_GPUS_ON_NODE": "²"}, "SLURM_GPUS_ON_NODE"),
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID"),
    ({"SLURM_STEP_ID": "<unset>"}, "this is the batch script itself"),
]


@pytest.mark.parametrize(("changes", "fragment"), BAD, ids=[f for _, f in BAD])
def test_bad_slurm_env_is_a_clear_error(job_file: Path, changes: dict[str, str], fragment: str) -> None:
    env = step_env("node[01-02]", HOSTS2, 1, **changes)
    with pytest.raises(PlatformError) as info:
        plan_for(job_file, env)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("changes", "fragment"), [BAD[0], BAD[4], BAD[11], BAD[17]], ids=["syntax", "huge", "procid", "batch"]
)
def test_bad_slurm_env_through_the_cli_exits_2_without_traceback(
    job_file: Path, changes: dict[str, str], fragment: str
) -> None:
    env = clean_env(**step_env("node[01-02]", HOSTS2, 1, **changes))
    for command in (["plan", str(job_file)], ["--engine", "pytorch", str(job_file)]):
        result = run_cli(command, env)
        assert result.code == 2, (result.stdout, result.stderr)
        assert fragment in result.stderr and result.traceback is None and "Traceback" not in result.stderr


def test_without_python_hostlist_scontrol_expands_or_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """python-hostlist is an extra (it ships no wheel); Slurm's own scontrol is the fallback on a Slurm node."""
    import sys

    monkeypatch.setitem(sys.modules, "hostlist", None)  # import hostlist → ImportError
    scontrol = shutil.which("scontrol")
    usable = scontrol and subprocess.run([scontrol, "show", "hostnames", "a1"], capture_output=True).returncode == 0
    if usable:  # scontrol needs a slurm.conf even for this: a Slurm node has one
        assert expand_nodelist("node[01-03,07]", "SLURM_JOB_NODELIST") == ["node01", "node02", "node03", "node07"]
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(PlatformError, match=r"neither python-hostlist \(pip install 'mlaunch\[slurm\]'\) nor"):
        expand_nodelist("node[01-03]", "SLURM_JOB_NODELIST")
