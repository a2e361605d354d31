"""Kubeflow Trainer v2: ``mlaunch manifest --target trainjob`` and the env Trainer injects.

The manifests are validated strictly against the pinned v2.3.0 CRDs in ``../shared/crds``
(TrainJob, TrainingRuntime, ClusterTrainingRuntime) and the runtime's JobSet template against
the JobSet v0.12.0 CRD, with the validator ``test_manifest`` uses; pod and Job templates with
kubernetes-validate.

Trainer's controller cannot run here, so its torch plugin is emulated by its documented rules
(kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/torch/torch.go``: ``PET_NNODES`` =
numNodes, ``PET_NPROC_PER_NODE`` = numProcPerNode or ``auto``, ``PET_NODE_RANK`` = the pod's
completion index, ``PET_MASTER_ADDR`` = ``<job>-node-0-0.<job>``, ``PET_MASTER_PORT`` = 29500;
Kubernetes adds ``JOB_COMPLETION_INDEX``). The launcher side is real: ``make_plan`` and the
``mlaunch plan --json`` command.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import clean_env, run_mlaunch
from test_manifest import (
    VARIANTS,
    core_validate,
    crd_errors,
    needs_crds,
    validate_all,
    write_job,
)
from test_manifest_roundtrip import template_env

from launchers.config.job import load_job
from launchers.config.timers import timer_chain
from launchers.errors import PlatformError
from launchers.generate.k8s.manifests import build, render
from launchers.platform.trainer_env import from_trainer_env
from launchers.run.runner import make_plan

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def trainjob_docs(job_file: Path, *, cluster: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(runtime, TrainJob) as kubectl would read them from the rendered file."""
    job = load_job(job_file)
    text = render(build(job, "trainjob", "pytorch", cluster_runtime=cluster), job, "pytorch")
    runtime, train_job, key = [d for d in yaml.safe_load_all(text) if d]
    assert key["kind"] == "Secret"  # the job's control-plane key, last (tests/test_manifest.py checks it)
    return runtime, train_job


def node_job(runtime: dict[str, Any]) -> dict[str, Any]:
    """The replicated Job Trainer treats as the trainer (ancestor label ``trainer``)."""
    (found,) = [
        rj
        for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]
        if rj["template"]["metadata"]["labels"].get(ANCESTOR) == "trainer"
    ]
    return found


# ----------------------------------------------------------------------------------------
# The manifest
# ----------------------------------------------------------------------------------------


@needs_crds
@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("variant", ["plain", "volumes-and-resources"])
def test_trainjob_and_runtime_validate(tmp_path: Path, variant: str, nodes: int, cluster: bool) -> None:
    runtime, train_job = trainjob_docs(
        write_job(tmp_path, "pytorch", nodes, **copy.deepcopy(VARIANTS[variant])), cluster=cluster
    )
    validate_all("trainjob", [runtime, train_job])
    for document in (runtime, train_job):
        errors = crd_errors("trainjob", document)
        assert not errors, errors
    # the replicated Job's own template as a batch/v1 Job (Job-level fields such as backoffLimit)
    core_validate(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "x"},
            "spec": node_job(runtime)["template"]["spec"],
        }
    )
    assert runtime["kind"] == ("ClusterTrainingRuntime" if cluster else "TrainingRuntime")
    assert ("namespace" in runtime["metadata"]) is not cluster  # cluster-scoped has none
    assert train_job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": runtime["kind"],
        "name": runtime["metadata"]["name"],
    }


@needs_crds
def test_the_validation_can_fail(tmp_path: Path) -> None:
    """Unknown fields in the TrainJob, the runtime, and the JobSet template are each reported."""
    runtime, train_job = trainjob_docs(write_job(tmp_path, "pytorch"))
    train_job["spec"]["trainer"]["numNode"] = 2
    assert any("numNode" in e for e in crd_errors("trainjob", train_job))
    runtime["spec"]["mlPolicy"]["torchh"] = {}
    node_job(runtime)["template"]["spec"]["backofLimit"] = 1
    errors = crd_errors("trainjob", runtime)
    assert any("torchh" in e for e in errors)
    assert any(e.startswith("JobSet") and "backofLimit" in e for e in errors)


def test_layout_policy_and_pod_contract(tmp_path: Path) -> None:
    job_file = write_job(
        tmp_path,
        "pytorch",
        4,
        2,
        restart={"max_restarts": 3},
        checkpoint={"dir": "output/ckpt", "grace_period": "45s"},
        kubernetes={"output": {"pvc": "ckpt"}, "shm_size": "2Gi", "env_from_secrets": ["wandb"]},
        env={"WANDB_API_KEY": "s3cr3t"},
    )
    runtime, train_job = trainjob_docs(job_file)
    assert train_job["spec"]["trainer"] == {"numNodes": 4, "numProcPerNode": 2}
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 4, "torch": {}}
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["failurePolicy"] == {"maxRestarts": 3, "restartStrategy": "Recreate"}
    rj = node_job(runtime)
    assert rj["name"] == "node" and rj["template"]["spec"]["backoffLimit"] == 0
    pod = rj["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "node"  # where Trainer's torch plugin injects PET_*
    assert container["command"][:3] == ["mlaunch", "--engine", "pytorch"]
    assert container["command"][3].endswith("/job.yaml")
    assert pod["restartPolicy"] == "Never"
    assert (
        pod["terminationGracePeriodSeconds"] == timer_chain(load_job(job_file)).termination_grace_period_seconds == 60
    )
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == "ckpt" for v in volumes.values())
    assert {"containerPort": 29500, "name": "trainer-port"} in container["ports"]
    assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    text = yaml.safe_dump_all([runtime, train_job])
    assert "s3cr3t" not in text and "WANDB_API_KEY" not in text


def test_no_restarts_means_no_jobset_restart(tmp_path: Path) -> None:
    runtime, _ = trainjob_docs(write_job(tmp_path, "pytorch", 2))
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 0


def test_cli_writes_the_runtime_first_and_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "pytorch", 2, pytorch={"master_port": 6000})
    out = tmp_path / "trainjob.yaml"
    result = run_mlaunch(["manifest", "-t", "trainjob", "--cluster-runtime", str(job_file), "-o", str(out)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ClusterTrainingRuntime mlaunch-demo, TrainJob demo" in result.stderr
    text = out.read_text()
    assert "pytorch.master_port 6000 is not used" in text  # Trainer fixes PET_MASTER_PORT at 29500
    kinds = [d["kind"] for d in yaml.safe_load_all(text) if d]
    assert kinds == ["ClusterTrainingRuntime", "TrainJob", "Secret"]
    for args, message in [
        (["-t", "pytorchjob", "--cluster-runtime"], "--cluster-runtime applies to --target trainjob only"),
        (["-t", "trainjob", "--engine", "mpi"], "use --target"),
    ]:
        result = run_mlaunch(["manifest", *args, str(job_file)], timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    long_name = write_job(tmp_path, "pytorch", 2)
    data = yaml.safe_load(long_name.read_text())
    data["name"] = "x" * 60
    long_name.write_text(yaml.safe_dump(data))
    result = run_mlaunch(["manifest", "-t", "trainjob", str(long_name)], timeout=60)
    assert result.returncode == 2 and "-node-0-1" in result.stderr


# ----------------------------------------------------------------------------------------
# Round trip: the env Trainer injects into node i → mlaunch's plan there
# ----------------------------------------------------------------------------------------


def trainer_pods_env(runtime: dict[str, Any], train_job: dict[str, Any]) -> list[dict[str, str]]:
    """Each trainer pod's env: the template's own, then the torch plugin's PET_* and the Job index."""
    name = train_job["metadata"]["name"]
    trainer = train_job["spec"].get("trainer", {})
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"]["numNodes"])
    nproc = trainer.get("numProcPerNode", "auto")
    template = node_job(runtime)["template"]["spec"]["template"]
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "node"]
    envs = []
    for i in range(nodes):
        env = template_env(container, f"10.244.0.{10 + i}", f"{name}-node-0-{i}-abcde", template["metadata"]["labels"])
        env.update(
            {
                "PET_NNODES": str(nodes),
                "PET_NPROC_PER_NODE": str(nproc),
                "PET_NODE_RANK": str(i),
                "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
                "PET_MASTER_PORT": "29500",
                "JOB_COMPLETION_INDEX": str(i),
            }
        )
        envs.append(env)
    return envs


def check_one_job(plans: list[dict[str, Any]], nodes: int, procs: int) -> None:
    ranks = sorted(p["rank"] for plan in plans for node in plan["nodes"] for p in node["processes"])
    assert ranks == list(range(nodes * procs))
    assert {plan["world_size"] for plan in plans} == {nodes * procs}
    assert {(plan["master_addr"], plan["master_port"]) for plan in plans} == {("demo-node-0-0.demo", 29500)}
    assert {plan["source"] for plan in plans} == {"kubeflow-trainer"}
    assert [node["index"] for plan in plans for node in plan["nodes"]] == list(range(nodes))  # pod i is node i


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_round_trip_every_node(tmp_path: Path, nodes: int) -> None:
    job_file = write_job(tmp_path, "pytorch", nodes, 2)
    job = load_job(job_file)
    envs = trainer_pods_env(*trainjob_docs(job_file))
    plans = [make_plan(job, "pytorch", [], env)[2].to_json() for env in envs]
    check_one_job(plans, nodes, 2)
    for env, plan in zip(envs, plans, strict=True):
        for proc in (p for node in plan["nodes"] for p in node["processes"]):
            assert proc["env"]["MASTER_ADDR"] == "demo-node-0-0.demo" and proc["env"]["WORLD_SIZE"] == str(nodes * 2)
            assert proc["env"]["NODE_RANK"] == env["PET_NODE_RANK"]


def test_round_trip_through_the_real_cli(tmp_path: Path) -> None:
    """Three pods, each planned by `mlaunch plan --json` with only Trainer's env (plus PATH etc.)."""
    job_file = write_job(tmp_path, "pytorch", 3, 2)
    plans = []
    for env in trainer_pods_env(*trainjob_docs(job_file)):
        result = run_mlaunch(["plan", "--json", str(job_file)], env=clean_env(**env), timeout=60)
        assert result.returncode == 0, result.stderr
        plans.append(json.loads(result.stdout))
    check_one_job(plans, 3, 2)


def test_round_trip_with_auto_processes(tmp_path: Path) -> None:
    """numProcPerNode left to Trainer (``auto``): one process per visible GPU, else job.yaml's procs_per_node."""
    job_file = write_job(tmp_path, "pytorch", 2, 2)
    runtime, train_job = trainjob_docs(job_file)
    del train_job["spec"]["trainer"]["numProcPerNode"]
    envs = trainer_pods_env(runtime, train_job)
    assert {e["PET_NPROC_PER_NODE"] for e in envs} == {"auto"}
    job = load_job(job_file)
    with_gpus = [make_plan(job, "pytorch", [], {**e, "CUDA_VISIBLE_DEVICES": "0,1,2"})[2].to_json() for e in envs]
    check_one_job(with_gpus, 2, 3)
    no_gpu = [make_plan(job, "pytorch", [], {**e, "CUDA_VISIBLE_DEVICES": ""})[2].to_json() for e in envs]
    check_one_job(no_gpu, 2, 2)


# ----------------------------------------------------------------------------------------
# Detection: what Trainer's env means, and what it must refuse
# ----------------------------------------------------------------------------------------

ISSUE_ENV = {
    "PET_NNODES": "4",
    "PET_NPROC_PER_NODE": "2",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "demo-node-0-0.demo",
    "PET_MASTER_PORT": "29500",
}


def plan_cli(job_file: Path, **env: str) -> Any:
    return run_mlaunch(["plan", "--json", str(job_file)], env=clean_env(**env), timeout=60)


def test_the_env_from_the_issue_plans(tmp_path: Path) -> None:
    """Before: exit 2, "the platform (kubeflow-pytorchjob) runs 4 nodes but names no master address"."""
    result = plan_cli(write_job(tmp_path, "pytorch", 4, 2), **ISSUE_ENV)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["source"] == "kubeflow-trainer" and plan["master_addr"] == "demo-node-0-0.demo"
    (node,) = plan["nodes"]
    assert node["index"] == 1 and node["host"] == "demo-node-0-1.demo"
    assert [p["rank"] for p in node["processes"]] == [2, 3]


def test_v1_pytorchjob_env_is_still_kubeflow_pytorchjob(tmp_path: Path) -> None:
    """The v1 operator sets MASTER_ADDR beside PET_MASTER_ADDR (and RANK, WORLD_SIZE)."""
    env = {
        **ISSUE_ENV,
        "PET_MASTER_ADDR": "demo-master-0",
        "MASTER_ADDR": "demo-master-0",
        "RANK": "1",
        "WORLD_SIZE": "8",
    }
    result = plan_cli(write_job(tmp_path, "pytorch", 4, 2), **env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["source"] == "kubeflow-pytorchjob"


def test_job_completion_index_alone_is_no_platform(tmp_path: Path) -> None:
    result = plan_cli(write_job(tmp_path, "pytorch", 2, 1), JOB_COMPLETION_INDEX="1")
    assert result.returncode == 0 and json.loads(result.stdout)["source"] == "local-simulation"


def test_completion_index_stands_in_for_pet_node_rank(tmp_path: Path) -> None:
    env = {k: v for k, v in ISSUE_ENV.items() if k != "PET_NODE_RANK"}
    result = plan_cli(write_job(tmp_path, "pytorch", 4, 2), **env, JOB_COMPLETION_INDEX="3")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["nodes"][0]["index"] == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"PET_NNODES": "abc"}, "PET_NNODES='abc' is not an integer"),
        ({"PET_NNODES": ""}, "PET_NNODES is set but empty"),
        ({"PET_NODE_RANK": "4"}, "this node's index 4 (PET_NODE_RANK=4 (kubeflow-trainer)) is outside 0..3"),
        ({"PET_NODE_RANK": "-1"}, "PET_NODE_RANK='-1' must be ≥ 0"),
        ({"PET_NPROC_PER_NODE": "two"}, "PET_NPROC_PER_NODE='two' is not an integer; expected a number of processes"),
        ({"PET_MASTER_PORT": "70000"}, "PET_MASTER_PORT='70000' must be ≤ 65535"),
        ({"PET_MASTER_ADDR": " "}, "PET_MASTER_ADDR is set but empty"),
        (
            {"JOB_COMPLETION_INDEX": "2"},
            "PET_NODE_RANK=1 (kubeflow-trainer) says 1, but JOB_COMPLETION_INDEX=2 (the pod's Indexed Job) says 2",
        ),
        ({"WORLD_SIZE": "6"}, "WORLD_SIZE=6 fits neither 4 nodes × 2 processes = 8 nor 4 pods; check PET_NNODES"),
        ({"SKYPILOT_NUM_NODES": "2"}, "PET_NNODES=4 (kubeflow-trainer) says 4, but SKYPILOT_NUM_NODES=2 (skypilot)"),
    ],
)
def test_bad_or_contradicting_env_is_a_clear_error(tmp_path: Path, change: dict[str, str], message: str) -> None:
    result = plan_cli(write_job(tmp_path, "pytorch", 4, 2), **{**ISSUE_ENV, **change})
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_auto_counts_nvidia_device_nodes(tmp_path: Path) -> None:
    """Without CUDA_VISIBLE_DEVICES, ``auto`` counts /dev/nvidiaN as the GPUs the device plugin gave the pod."""
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    s = from_trainer_env({**ISSUE_ENV, "PET_NPROC_PER_NODE": "auto"}, dev_dir=tmp_path)
    assert s is not None and s.facts["nproc"] == 2
    s = from_trainer_env({**ISSUE_ENV, "PET_NPROC_PER_NODE": "auto"}, dev_dir=tmp_path / "absent")
    assert s is not None and "nproc" not in s.facts  # job.yaml's procs_per_node decides
    with pytest.raises(PlatformError, match="PET_NPROC_PER_NODE='0' must be ≥ 1"):
        from_trainer_env({**ISSUE_ENV, "PET_NPROC_PER_NODE": "0"})
