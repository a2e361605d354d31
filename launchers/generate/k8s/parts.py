"""What several targets put around the pod template: metadata, ports, replicas, restarts, secrets.

The pod itself is ``launchers.generate.k8s.pod``; each target module assembles its operator's job
kind from these parts, and ``launchers.generate.k8s.manifests`` picks the target.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from launchers.config.job import Job
from launchers.generate.k8s.pod import ContainerPaths, Mounts, check_namespace, downward_env, labels
from launchers.platform.cluster import DEFAULT_MASTER_PORT

KUBEFLOW_PYTORCH_PORT = 23456  # training-operator's default pytorchjob-port
ASCENDJOB_PORT = 2222  # ascend-operator's default ascendjob-port
RANK_TABLE_MOUNT = "/user/serverid/devindex/config"  # where MindCluster delivers hccl.json
RANK_TABLE_FILE = f"{RANK_TABLE_MOUNT}/hccl.json"
MPI_KEYS_MOUNT = "/etc/mlaunch/ssh"


@dataclass
class Manifest:
    """The documents to apply (the job first) and notes for the header comment."""

    target: str
    documents: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def metadata(
    job: Job, name: str, extra_labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": check_namespace(job),
        "labels": {**labels(name), **(extra_labels or {})},
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


# ----------------------------------------------------------------------------------------
# Ports
# ----------------------------------------------------------------------------------------


def ha_ports(job: Job) -> list[dict[str, Any]]:
    """TaskD's manager port on every pod; the TFT controller port when it runs on node 0."""
    from launchers.engines.high_availability import TASKD_PORT, TFT_DEFAULT_PORT

    ha = job.high_availability
    ports = []
    if ha.taskd:
        ports.append({"containerPort": TASKD_PORT, "name": "taskd-port"})
    if ha.tft and not ha.controller:
        ports.append({"containerPort": TFT_DEFAULT_PORT, "name": "tft-port"})
    return ports


def engine_ports(job: Job, engine: str, target: str) -> list[dict[str, Any]]:
    """The ports each operator expects, and the ones mlaunch's engines listen on."""
    ports: list[dict[str, Any]] = []
    if engine == "pytorch":
        default = {"pytorchjob": KUBEFLOW_PYTORCH_PORT, "ascendjob": ASCENDJOB_PORT}.get(target, DEFAULT_MASTER_PORT)
        name = "ascendjob-port" if target == "ascendjob" else "pytorchjob-port"
        ports.append({"containerPort": job.pytorch.master_port or default, "name": name})
    elif engine == "tensorflow":
        ports.append({"containerPort": job.tensorflow.port, "name": "tfjob-port"})
        if target == "volcano":  # ps beside workers, on the ports after tensorflow.port
            per_node = job.procs_per_node + job.tensorflow.ps
            ports += [{"containerPort": job.tensorflow.port + k, "name": f"tf-{k}"} for k in range(1, per_node)]
    elif engine == "mpi":
        ports.append({"containerPort": job.mpi.sshd_port, "name": "sshd"})
        done = getattr(job.mpi, "completion_port", None) or job.mpi.sshd_port + 1
        ports.append({"containerPort": done, "name": "mpi-done"})  # node 0's control plane (the exit code, failures)
    elif engine == "ascend":
        if target == "ascendjob":
            port = job.ascend.sched_port if job.ascend.style == "msrun" else ASCENDJOB_PORT
            ports.append({"containerPort": port, "name": "ascendjob-port"})
        elif job.ascend.style == "msrun":
            ports.append({"containerPort": job.ascend.sched_port, "name": "ms-sched"})
    seen: set[int] = set()
    unique = []
    for entry in [*ports, *ha_ports(job)]:
        if entry["containerPort"] not in seen:
            seen.add(entry["containerPort"])
            unique.append(entry)
    return unique


# ----------------------------------------------------------------------------------------
# Replicas and restarts (Kubeflow-style operators)
# ----------------------------------------------------------------------------------------


def kubeflow_restart(job: Job) -> tuple[str, int]:
    """(replica restartPolicy, runPolicy.backoffLimit): restarts mean OnFailure, none means Never."""
    n = job.restart.max_restarts
    return ("OnFailure", n) if n > 0 else ("Never", 0)


def replica(replicas: int, restart_policy: str, template: dict[str, Any]) -> dict[str, Any]:
    return {"replicas": replicas, "restartPolicy": restart_policy, "template": copy.deepcopy(template)}


def run_policy(job: Job, pods: int, backoff: int) -> dict[str, Any]:
    scheduling: dict[str, Any] = {"minAvailable": pods}
    if job.kubernetes.queue != "default":
        scheduling["queue"] = job.kubernetes.queue
    return {"backoffLimit": backoff, "cleanPodPolicy": "Running", "schedulingPolicy": scheduling}


# ----------------------------------------------------------------------------------------
# MPI's ssh secret, Ascend's rank table
# ----------------------------------------------------------------------------------------


def mpi_keys(job: Job, name: str) -> tuple[Mounts, list[dict[str, Any]], str]:
    """The job's ssh secret (from ``mlaunch keys DIR``) mounted from a Secret; env naming it when job.yaml does not."""
    mounts, env = Mounts(), []
    if job.mpi.keys_dir:
        path = ContainerPaths(job, job.kubernetes.code_mount).setting("mpi.keys_dir", job.mpi.keys_dir)
    else:
        path = MPI_KEYS_MOUNT
        env.append({"name": "MLAUNCH_SSH_KEYS", "value": path})
    secret = job.kubernetes.ssh_secret or f"{name}-mlaunch-ssh"
    # 0400: mlaunch copies the files into a private runtime directory before sshd reads them.
    mounts.add("mlaunch-ssh", {"secret": {"secretName": secret, "defaultMode": 0o400}}, path, read_only=True)
    namespace = check_namespace(job)
    note = (
        f"MPI ssh secret: create it once before applying: mlaunch keys ./job-ssh && kubectl create secret generic "
        f"{secret} --from-file=./job-ssh -n {namespace} (mounted at {path})"
    )
    return mounts, env, note


def rank_table_pieces(job: Job, name: str) -> tuple[dict[str, Any], Mounts, list[dict[str, Any]]]:
    """ConfigMap ``rings-config-<job>`` (filled in by MindCluster), its mount, and the env pointing at it."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"rings-config-{name}",
            "namespace": check_namespace(job),
            "labels": {**labels(name), "ring-controller.atlas": job.kubernetes.ring_controller},
        },
        "data": {"hccl.json": '{"status":"initializing"}'},
    }
    mounts = Mounts()
    mounts.add("ascend-910-config", {"configMap": {"name": f"rings-config-{name}"}}, RANK_TABLE_MOUNT)
    env = [
        {"name": "RANK_TABLE_FILE", "value": RANK_TABLE_FILE},
        # MindCluster's hccl.json lists each pod's IP as container_ip: mlaunch finds its server by it.
        downward_env("MA_CURRENT_HOST_IP", "status.podIP"),
    ]
    return config_map, mounts, env
