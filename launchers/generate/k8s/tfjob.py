"""``tfjob``: a kubeflow.org/v1 TFJob, one TensorFlow task per pod as ``TF_CONFIG`` names them.

Chief (when ``tensorflow.chief``) + Worker per node + PS (``tensorflow.ps`` × nodes, without
accelerators). Restarts: ``restartPolicy: OnFailure`` + ``backoffLimit: n`` (``Never`` when n = 0).
"""

from __future__ import annotations

from typing import Any

from launchers.config.job import Job
from launchers.generate.k8s.parts import Manifest, engine_ports, kubeflow_restart, metadata, replica, run_policy
from launchers.generate.k8s.pod import ContainerSpec, k8s_name, pod_template

NAME = "tfjob"
ENGINES = ("tensorflow",)


def build(job: Job, engine: str) -> Manifest:
    """One TensorFlow task per pod, as TF_CONFIG names them: Chief?, Worker per node, PS (ps × nodes)."""
    nodes, opts = job.nodes, job.tensorflow
    chief = 1 if opts.chief else 0
    workers, ps = nodes - chief, opts.ps * nodes
    longest = max([f"-worker-{workers - 1}" if workers else "", f"-ps-{ps - 1}" if ps else "", "-chief-0"], key=len)
    name = k8s_name(job, longest)
    restart, backoff = kubeflow_restart(job)
    ports = engine_ports(job, engine, NAME)
    trainer = pod_template(job, engine, name, ContainerSpec(name="tensorflow", ports=ports))
    replicas: dict[str, Any] = {}
    if chief:
        replicas["Chief"] = replica(1, restart, trainer)
    if workers:
        replicas["Worker"] = replica(workers, restart, trainer)
    if ps:
        server = pod_template(job, engine, name, ContainerSpec(name="tensorflow", ports=ports, accelerators=False))
        replicas["PS"] = replica(ps, restart, server)
    notes = []
    if job.procs_per_node > 1:
        notes.append(
            f"each worker pod runs one TensorFlow worker task with {job.procs_per_node} devices (TF_CONFIG names one "
            "task per pod)"
        )
    document = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata(job, name),
        "spec": {"runPolicy": run_policy(job, nodes + ps, backoff), "tfReplicaSpecs": replicas},
    }
    return Manifest(NAME, [document], notes)
