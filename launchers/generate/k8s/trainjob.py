"""``trainjob``: a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) and the runtime it names.

Two documents, the runtime first: Trainer's webhook refuses a TrainJob whose TrainingRuntime does
not exist yet ("specified trainingRuntime must be created before the TrainJob"), and
``kubectl apply -f`` creates them in file order.

- The ``TrainingRuntime`` (``ClusterTrainingRuntime`` with ``cluster_runtime``) holds the JobSet
  template: one replicated Job ``node`` whose pods run mlaunch in the container ``node``
  (Trainer's torch plugin finds the trainer container by that name and injects ``PET_*``
  into it), labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``, with
  ``mlPolicy.torch`` and ``mlPolicy.numNodes``.
- The ``TrainJob`` sets ``trainer.numNodes`` = ``nodes`` and ``trainer.numProcPerNode`` =
  ``procs_per_node``; Trainer turns them into ``PET_NNODES``/``PET_NPROC_PER_NODE``, each pod's
  completion index into ``PET_NODE_RANK`` and ``<job>-node-0-0.<job>:29500`` into
  ``PET_MASTER_ADDR``/``PET_MASTER_PORT``, which mlaunch reads (``launchers.platform.trainer_env``).

Restarts: every node must join a new attempt together (the ``PET_*`` rendezvous is static), so
a failed pod fails its Job (``restartPolicy: Never``, ``backoffLimit: 0``) and JobSet's
``failurePolicy`` recreates the whole set, ``restart.max_restarts`` times. mlaunch's own
in-pod restarts come first; this is for a node lost or a pod killed.
"""

from __future__ import annotations

from typing import Any

from launchers.config.job import Job
from launchers.generate.k8s.parts import Manifest, ha_ports, metadata
from launchers.generate.k8s.pod import ContainerSpec, k8s_name, pod_template
from launchers.platform.trainer_env import TRAINER_PORT

NAME = "trainjob"
ENGINES = ("pytorch",)
API_VERSION = "trainer.kubeflow.org/v1alpha1"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # constants.LabelTrainJobAncestor
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
NODE = "node"  # constants.Node: the replicated Job and the container Trainer injects PET_* into


def ports(job: Job) -> list[dict[str, Any]]:
    """Trainer's fixed trainer port (PET_MASTER_PORT), then TaskD/TFT ports when high availability asks."""
    found = [{"containerPort": TRAINER_PORT, "name": "trainer-port"}]
    found += [p for p in ha_ports(job) if p["containerPort"] != TRAINER_PORT]
    return found


def runtime(job: Job, engine: str, name: str, runtime_name: str, *, cluster: bool) -> dict[str, Any]:
    """The (Cluster)TrainingRuntime: mlPolicy.torch and the JobSet template with mlaunch in ``node``."""
    template = pod_template(
        job,
        engine,
        name,
        ContainerSpec(name=NODE, ports=ports(job)),
        restart_policy="Never",
    )
    jobset: dict[str, Any] = {
        "failurePolicy": {"maxRestarts": job.restart.max_restarts, "restartStrategy": "Recreate"},
        "replicatedJobs": [
            {
                "name": NODE,
                "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                    "spec": {"backoffLimit": 0, "template": template},
                },
            }
        ],
    }
    meta = metadata(job, runtime_name, {FRAMEWORK_LABEL: "torch"})
    if cluster:
        del meta["namespace"]  # cluster-scoped
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterTrainingRuntime" if cluster else "TrainingRuntime",
        "metadata": meta,
        "spec": {
            "mlPolicy": {"numNodes": job.nodes, "torch": {}},
            "template": {"spec": jobset},
        },
    }


def build(job: Job, engine: str, *, cluster_runtime: bool = False) -> Manifest:
    nodes = job.nodes
    # JobSet names node i's pod host <job>-node-0-<i> (a DNS label: at most 63 characters).
    name = k8s_name(job, f"-{NODE}-0-{nodes - 1}")
    runtime_name = f"mlaunch-{name}"
    kind = "ClusterTrainingRuntime" if cluster_runtime else "TrainingRuntime"
    train_job = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": metadata(job, name),
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": kind, "name": runtime_name},
            "trainer": {"numNodes": nodes, "numProcPerNode": job.procs_per_node},
        },
    }
    notes = [f"apply the {kind} before the TrainJob (this file lists it first)"]
    if job.pytorch.master_port not in (None, TRAINER_PORT):
        notes.append(
            f"Trainer fixes the master port at {TRAINER_PORT} (PET_MASTER_PORT); pytorch.master_port "
            f"{job.pytorch.master_port} is not used in this TrainJob"
        )
    if cluster_runtime:
        notes.append(f"{kind} {runtime_name} is cluster-wide: one per job name across all namespaces")
    documents = [runtime(job, engine, name, runtime_name, cluster=cluster_runtime), train_job]
    return Manifest(NAME, documents, notes)
