"""``mpijob``: a kubeflow.org/v2beta1 MPIJob, Worker × (nodes−1) + Launcher (``runLauncherAsWorker``).

The templates name the hosts (``VC_WORKER_HOSTS``) and each pod's index (``VC_TASK_INDEX``: the
operator's ``replica-index`` label for workers, the last index for the launcher), which is all
the MPI engine needs: worker 0 runs mpirun, the launcher waits for its exit code.
"""

from __future__ import annotations

from typing import Any

from launchers.config.job import Job
from launchers.generate.k8s.parts import (
    Manifest,
    engine_ports,
    kubeflow_restart,
    metadata,
    mpi_keys,
    replica,
    run_policy,
)
from launchers.generate.k8s.pod import ContainerSpec, downward_env, k8s_name, pod_template

NAME = "mpijob"
ENGINES = ("mpi",)
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"  # set on MPIJob worker pods by the MPI Operator


def host_list(name: str, pods: list[str]) -> str:
    """``VC_WORKER_HOSTS``-style list: ``<pod>.<job>`` (hostname.subdomain of each pod)."""
    return ",".join(f"{pod}.{name}" for pod in pods)


def build(job: Job, engine: str) -> Manifest:
    """Worker i is node i and runs mpirun on worker 0; the launcher (``runLauncherAsWorker``) is the last node.

    A template is shared by all pods of a replica type, so each pod's index comes from the
    operator's ``replica-index`` label (downward API) for workers; the launcher's is fixed.
    The MPI Operator's own hostfile and ssh keys are not used: mlaunch's MPI engine runs
    its own sshd with the job secret and writes its own hostfile.
    """
    nodes = job.nodes
    name = k8s_name(job, f"-worker-{nodes - 2}" if nodes > 2 else "-launcher")
    restart, backoff = kubeflow_restart(job)
    pods = [f"{name}-worker-{i}" for i in range(nodes - 1)] + [f"{name}-launcher"]
    mounts, keys_env, note = mpi_keys(job, name)
    hosts = [
        {"name": "VC_WORKER_HOSTS", "value": host_list(name, pods)},
        {"name": "VC_WORKER_NUM", "value": str(nodes)},
    ]
    ports = engine_ports(job, engine, NAME)

    def template(index_env: dict[str, Any]) -> dict[str, Any]:
        spec = ContainerSpec(name="mlaunch", ports=ports, env=[*keys_env, *hosts, index_env], extra=mounts)
        return pod_template(job, engine, name, spec)

    replicas = {"Launcher": replica(1, restart, template({"name": "VC_TASK_INDEX", "value": str(nodes - 1)}))}
    if nodes > 1:
        worker_index = downward_env("VC_TASK_INDEX", f"metadata.labels['{REPLICA_INDEX_LABEL}']")
        replicas["Worker"] = replica(nodes - 1, restart, template(worker_index))
    document = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": metadata(job, name),
        "spec": {
            "slotsPerWorker": job.procs_per_node,
            "runLauncherAsWorker": True,  # the launcher pod holds accelerators and runs ranks too
            "mpiImplementation": "OpenMPI",
            "runPolicy": run_policy(job, nodes, backoff),
            "mpiReplicaSpecs": replicas,
        },
    }
    return Manifest(NAME, [document], [note])
