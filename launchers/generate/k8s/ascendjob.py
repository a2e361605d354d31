"""``ascendjob``: a mindxdl.gitee.com/v1 AscendJob (MindCluster) for PyTorch or MindSpore on NPUs.

PyTorch: Master + Worker, with ``MASTER_*``/``RANK``/``WORLD_SIZE``; MindSpore: Scheduler (holding
NPUs, node 0) + Worker, with ``MS_*``; for rank-table jobs the ``rings-config-<job>`` ConfigMap
MindCluster fills in. Restarts: ``restartPolicy: Never`` with label ``fault-retry-times: n``;
``high_availability`` becomes ``process-recover-enable`` and the ``recover-strategy`` annotation.
"""

from __future__ import annotations

from launchers.config.job import Job
from launchers.errors import UserError
from launchers.generate.k8s.parts import Manifest, engine_ports, metadata, rank_table_pieces, replica
from launchers.generate.k8s.pod import ContainerSpec, k8s_name, pod_template, where

NAME = "ascendjob"
ENGINES = ("pytorch", "ascend")
DEFAULT_NPU = "huawei.com/Ascend910"


def recover_strategy(job: Job) -> list[str]:
    """MindCluster's recover-strategy from job.yaml: explicit, else uce/taskd → retry, arf → recover, ttp → dump."""
    ha = job.high_availability
    if ha.recover_strategy is not None:
        return list(dict.fromkeys(ha.recover_strategy))
    strategy = []
    if ha.uce or ha.taskd:
        strategy.append("retry")
    if ha.arf:
        strategy.append("recover")
    if ha.ttp or ha.uce or ha.arf:
        strategy.append("dump")
    return strategy


def build(job: Job, engine: str) -> Manifest:
    nodes, k8s = job.nodes, job.kubernetes
    framework = "pytorch" if engine == "pytorch" else "mindspore"
    leader = "Master" if framework == "pytorch" else "Scheduler"
    name = k8s_name(job, f"-worker-{nodes - 2}" if nodes > 2 else f"-{leader.lower()}-0")
    if job.restart.max_restarts > 100:
        raise UserError(
            f"{where(job)}restart.max_restarts is {job.restart.max_restarts}; MindCluster's fault-retry-times "
            "allows 0..100"
        )
    if not k8s.accelerator:
        job = job.model_copy(deep=True)
        job.kubernetes.accelerator = DEFAULT_NPU
    ring = {"ring-controller.atlas": k8s.ring_controller}
    spec = ContainerSpec(name="ascend", ports=engine_ports(job, engine, NAME))
    extra_docs = []
    if engine == "ascend" and job.ascend.style == "rank_table":
        config_map, spec.extra, spec.env = rank_table_pieces(job, name)
        extra_docs.append(config_map)
    strategy = recover_strategy(job)
    if strategy:
        spec.env = [*spec.env, {"name": "PROCESS_RECOVER", "value": "on"}]
    template = pod_template(job, engine, name, spec, template_labels=ring)
    job_labels = {
        "framework": framework,
        **ring,
        "fault-scheduling": k8s.fault_scheduling,
        "fault-retry-times": str(job.restart.max_restarts),
    }
    if k8s.pod_rescheduling:
        job_labels["pod-rescheduling"] = "on"
    annotations = {}
    if strategy:
        job_labels["process-recover-enable"] = "on"
        annotations["recover-strategy"] = ",".join(strategy)
    replicas = {leader: replica(1, "Never", template)}
    if nodes > 1:
        replicas["Worker"] = replica(nodes - 1, "Never", template)
    document = {
        "apiVersion": "mindxdl.gitee.com/v1",
        "kind": "AscendJob",
        "metadata": metadata(job, name, job_labels, annotations),
        "spec": {
            "schedulerName": "volcano",
            "runPolicy": {
                "backoffLimit": job.restart.max_restarts,
                "schedulingPolicy": {"minAvailable": nodes, "queue": k8s.queue},
            },
            "successPolicy": "AllWorkers",
            "replicaSpecs": replicas,
        },
    }
    notes = []
    if not k8s.accelerator:
        notes.append(f"NPUs: kubernetes.accelerator is not set; requesting {DEFAULT_NPU}: {job.procs_per_node} per pod")
    return Manifest(NAME, [document, *extra_docs], notes)
