"""``pytorchjob``: a kubeflow.org/v1 PyTorchJob, Master + Worker × (nodes−1).

The training operator sets ``MASTER_ADDR/PORT``, ``RANK``, ``WORLD_SIZE`` and ``PET_*``.
Restarts: ``restartPolicy: OnFailure`` + ``backoffLimit: n`` (``Never`` when n = 0).
"""

from __future__ import annotations

from launchers.config.job import Job
from launchers.generate.k8s.parts import Manifest, engine_ports, kubeflow_restart, metadata, replica, run_policy
from launchers.generate.k8s.pod import ContainerSpec, k8s_name, pod_template

NAME = "pytorchjob"
ENGINES = ("pytorch",)


def build(job: Job, engine: str) -> Manifest:
    nodes = job.nodes
    name = k8s_name(job, f"-worker-{nodes - 2}" if nodes > 2 else "-master-0")
    restart, backoff = kubeflow_restart(job)
    template = pod_template(job, engine, name, ContainerSpec(name="pytorch", ports=engine_ports(job, engine, NAME)))
    replicas = {"Master": replica(1, restart, template)}
    if nodes > 1:
        replicas["Worker"] = replica(nodes - 1, restart, template)
    document = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata(job, name),
        "spec": {
            "nprocPerNode": str(job.procs_per_node),
            "runPolicy": run_policy(job, nodes, backoff),
            "pytorchReplicaSpecs": replicas,
        },
    }
    return Manifest(NAME, [document])
