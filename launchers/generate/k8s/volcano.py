"""``volcano``: a batch.volcano.sh/v1alpha1 Job, task ``worker`` × nodes, for every engine.

The env and svc plugins give each pod ``VC_TASK_INDEX`` and ``VC_WORKER_HOSTS``/``VC_WORKER_NUM``
(plus the ssh plugin for MPI). Restarts: ``maxRetry: n+1`` (Volcano counts the failing attempt,
and turns 0 into 3) with ``PodEvicted/PodFailed → RestartJob``.
"""

from __future__ import annotations

from typing import Any

from launchers.config.job import Job
from launchers.generate.k8s.parts import RANK_TABLE_MOUNT, Manifest, engine_ports, metadata, mpi_keys, rank_table_pieces
from launchers.generate.k8s.pod import ContainerSpec, k8s_name, pod_template

NAME = "volcano"
ENGINES = ("pytorch", "tensorflow", "mpi", "ascend")


def build(job: Job, engine: str) -> Manifest:
    nodes = job.nodes
    name = k8s_name(job, f"-worker-{nodes - 1}")
    plugins: dict[str, list[str]] = {"env": [], "svc": []}
    notes = []
    spec = ContainerSpec(name="mlaunch", ports=engine_ports(job, engine, NAME))
    extra_docs: list[dict[str, Any]] = []
    job_labels: dict[str, str] = {}
    template_labels: dict[str, str] = {}
    if engine == "mpi":
        plugins["ssh"] = []
        spec.extra, spec.env, note = mpi_keys(job, name)
        notes.append(note)
    if engine == "ascend" and job.ascend.style == "rank_table":
        config_map, mounts, env = rank_table_pieces(job, name)
        extra_docs.append(config_map)
        spec.extra, spec.env = mounts, env
        job_labels = template_labels = {"ring-controller.atlas": job.kubernetes.ring_controller}
        notes.append(f"rank table: MindCluster fills ConfigMap rings-config-{name} (mounted at {RANK_TABLE_MOUNT})")
    template = pod_template(job, engine, name, spec, restart_policy="Never", template_labels=template_labels)
    document = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": metadata(job, name, job_labels),
        "spec": {
            "schedulerName": "volcano",
            "queue": job.kubernetes.queue,
            "minAvailable": nodes,
            # Volcano fails the job when RetryCount reaches maxRetry, counting the failure itself.
            "maxRetry": job.restart.max_restarts + 1,
            "policies": [{"events": ["PodEvicted", "PodFailed"], "action": "RestartJob"}],
            "plugins": plugins,
            "tasks": [{"name": "worker", "replicas": nodes, "minAvailable": nodes, "template": template}],
        },
    }
    return Manifest(NAME, [document, *extra_docs], notes)
