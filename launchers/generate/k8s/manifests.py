"""Kubernetes manifests for the cluster engines mlaunch runs under: one pod per node, mlaunch inside.

Targets (``mlaunch manifest --target T``), one pod per node unless said otherwise:

- ``volcano`` — batch.volcano.sh/v1alpha1 Job, task ``worker`` × nodes; the env and svc plugins
  give ``VC_TASK_INDEX`` and ``VC_WORKER_HOSTS``/``VC_WORKER_NUM`` (plus the ssh plugin for MPI).
- ``pytorchjob`` — kubeflow.org/v1 PyTorchJob, Master + Worker × (nodes−1); the operator sets
  ``MASTER_ADDR/PORT``, ``RANK``, ``WORLD_SIZE`` and ``PET_*``.
- ``tfjob`` — kubeflow.org/v1 TFJob, Chief (when ``tensorflow.chief``) + Worker per node + PS
  (``tensorflow.ps`` × nodes, no accelerators); ``TF_CONFIG`` names every task, one task per pod.
- ``mpijob`` — kubeflow.org/v2beta1 MPIJob, Worker × (nodes−1) + Launcher (``runLauncherAsWorker``);
  the templates name the hosts (``VC_WORKER_HOSTS``) and each pod's index (``VC_TASK_INDEX``: the
  operator's ``replica-index`` label for workers, the last index for the launcher), which is all
  the MPI engine needs: worker 0 runs mpirun, the launcher waits for its exit code.
- ``ascendjob`` — mindxdl.gitee.com/v1 AscendJob, PyTorch: Master + Worker, MindSpore: Scheduler
  (holding NPUs, node 0) + Worker; ``MASTER_*``/``RANK``/``WORLD_SIZE`` or ``MS_*``, and for
  rank-table jobs the ``rings-config-<job>`` ConfigMap MindCluster fills in.

Restart mapping from ``restart.max_restarts`` (n): Volcano ``maxRetry: n+1`` (Volcano counts the
failing attempt, and turns 0 into 3) with ``PodEvicted/PodFailed → RestartJob``; Kubeflow
``restartPolicy: OnFailure`` + ``backoffLimit: n`` (``Never`` when n = 0); AscendJob
``restartPolicy: Never`` with label ``fault-retry-times: n``.

Nothing secret is written: job.yaml's ``env`` is applied by mlaunch inside the pod, never
copied here; the MPI job's ssh secret (``mlaunch keys DIR``) is a Secret the user creates and the
pods mount by name; ``kubernetes.env_from_secrets`` references Secrets by name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from launchers.config.job import Job
from launchers.errors import UserError
from launchers.generate.k8s.pod import (
    ContainerLayout,
    ContainerSpec,
    Mounts,
    check_namespace,
    downward_env,
    k8s_name,
    labels,
    pod_template,
)
from launchers.platform.cluster import DEFAULT_MASTER_PORT

TARGETS: dict[str, tuple[str, ...]] = {
    "volcano": ("pytorch", "tensorflow", "mpi", "ascend"),
    "pytorchjob": ("pytorch",),
    "tfjob": ("tensorflow",),
    "mpijob": ("mpi",),
    "ascendjob": ("pytorch", "ascend"),
}
KUBEFLOW_PYTORCH_PORT = 23456  # training-operator's default pytorchjob-port
ASCENDJOB_PORT = 2222  # ascend-operator's default ascendjob-port
RANK_TABLE_MOUNT = "/user/serverid/devindex/config"  # where MindCluster delivers hccl.json
RANK_TABLE_FILE = f"{RANK_TABLE_MOUNT}/hccl.json"
DEFAULT_NPU = "huawei.com/Ascend910"
MPI_KEYS_MOUNT = "/etc/mlaunch/ssh"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"  # set on MPIJob worker pods by the MPI Operator


@dataclass
class Manifest:
    """The documents to apply (the job first) and notes for the header comment."""

    target: str
    documents: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def job(self) -> dict[str, Any]:
        return self.documents[0]


def _where(job: Job) -> str:
    return f"{job.source}: " if job.source else ""


# ----------------------------------------------------------------------------------------
# Shared decisions
# ----------------------------------------------------------------------------------------


def check_target(job: Job, target: str, engine: str) -> None:
    engines = TARGETS.get(target)
    if engines is None:
        raise UserError(f"unknown manifest target {target!r}; expected one of: {', '.join(TARGETS)}")
    if engine not in engines:
        fits = [t for t, e in TARGETS.items() if engine in e]
        raise UserError(
            f"target {target} runs the {' or '.join(engines)} engine, but this job uses the {engine} engine; "
            f"use --target {' or '.join(fits)}"
        )
    if engine == "pytorch" and job.pytorch.nnodes and ":" in job.pytorch.nnodes:
        raise UserError(
            f"{_where(job)}pytorch.nnodes {job.pytorch.nnodes!r} is an elastic range; mlaunch manifest writes "
            "fixed-size jobs (one pod per node of `nodes:`); set pytorch.nnodes to a number or remove it"
        )


def kubeflow_restart(job: Job) -> tuple[str, int]:
    """(replica restartPolicy, runPolicy.backoffLimit): restarts mean OnFailure, none means Never."""
    n = job.restart.max_restarts
    return ("OnFailure", n) if n > 0 else ("Never", 0)


def ascend_style(job: Job) -> str:
    return job.ascend.style


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
        ports.append({"containerPort": done, "name": "mpi-done"})  # node 0 tells the others the exit code
    elif engine == "ascend":
        if target == "ascendjob":
            port = job.ascend.sched_port if ascend_style(job) == "msrun" else ASCENDJOB_PORT
            ports.append({"containerPort": port, "name": "ascendjob-port"})
        elif ascend_style(job) == "msrun":
            ports.append({"containerPort": job.ascend.sched_port, "name": "ms-sched"})
    seen: set[int] = set()
    unique = []
    for entry in [*ports, *ha_ports(job)]:
        if entry["containerPort"] not in seen:
            seen.add(entry["containerPort"])
            unique.append(entry)
    return unique


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


def mpi_secret_name(job: Job, name: str) -> str:
    return job.kubernetes.ssh_secret or f"{name}-mlaunch-ssh"


def mpi_keys(job: Job, name: str) -> tuple[Mounts, list[dict[str, Any]], str]:
    """The job's ssh secret (from ``mlaunch keys DIR``) mounted from a Secret; env naming it when job.yaml does not."""
    mounts, env = Mounts(), []
    if job.mpi.keys_dir:
        path = ContainerLayout(job, job.kubernetes.code_mount).setting("mpi.keys_dir", job.mpi.keys_dir)
    else:
        path = MPI_KEYS_MOUNT
        env.append({"name": "MLAUNCH_SSH_KEYS", "value": path})
    secret = mpi_secret_name(job, name)
    # 0400: mlaunch copies the files into a private runtime directory before sshd reads them.
    mounts.add("mlaunch-ssh", {"secret": {"secretName": secret, "defaultMode": 0o400}}, path, read_only=True)
    namespace = check_namespace(job)
    note = (
        f"MPI ssh secret: create it once before applying: mlaunch keys ./job-ssh && kubectl create secret generic "
        f"{secret} --from-file=./job-ssh -n {namespace} (mounted at {path})"
    )
    return mounts, env, note


def host_list(name: str, pods: list[str]) -> str:
    """``VC_WORKER_HOSTS``-style list: ``<pod>.<job>`` (hostname.subdomain of each pod)."""
    return ",".join(f"{pod}.{name}" for pod in pods)


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


# ----------------------------------------------------------------------------------------
# Targets
# ----------------------------------------------------------------------------------------


def volcano(job: Job, engine: str) -> Manifest:
    nodes = job.nodes
    name = k8s_name(job, f"-worker-{nodes - 1}")
    plugins: dict[str, list[str]] = {"env": [], "svc": []}
    notes = []
    spec = ContainerSpec(name="mlaunch", ports=engine_ports(job, engine, "volcano"))
    extra_docs: list[dict[str, Any]] = []
    job_labels: dict[str, str] = {}
    template_labels: dict[str, str] = {}
    if engine == "mpi":
        plugins["ssh"] = []
        spec.extra, spec.env, note = mpi_keys(job, name)
        notes.append(note)
    if engine == "ascend" and ascend_style(job) == "rank_table":
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
    return Manifest("volcano", [document, *extra_docs], notes)


def _replica(replicas: int, restart_policy: str, template: dict[str, Any]) -> dict[str, Any]:
    return {"replicas": replicas, "restartPolicy": restart_policy, "template": copy.deepcopy(template)}


def _run_policy(job: Job, pods: int, backoff: int) -> dict[str, Any]:
    scheduling: dict[str, Any] = {"minAvailable": pods}
    if job.kubernetes.queue != "default":
        scheduling["queue"] = job.kubernetes.queue
    return {"backoffLimit": backoff, "cleanPodPolicy": "Running", "schedulingPolicy": scheduling}


def pytorchjob(job: Job, engine: str) -> Manifest:
    nodes = job.nodes
    name = k8s_name(job, f"-worker-{nodes - 2}" if nodes > 2 else "-master-0")
    restart, backoff = kubeflow_restart(job)
    template = pod_template(
        job, engine, name, ContainerSpec(name="pytorch", ports=engine_ports(job, engine, "pytorchjob"))
    )
    replicas = {"Master": _replica(1, restart, template)}
    if nodes > 1:
        replicas["Worker"] = _replica(nodes - 1, restart, template)
    document = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata(job, name),
        "spec": {
            "nprocPerNode": str(job.procs_per_node),
            "runPolicy": _run_policy(job, nodes, backoff),
            "pytorchReplicaSpecs": replicas,
        },
    }
    return Manifest("pytorchjob", [document])


def tfjob(job: Job, engine: str) -> Manifest:
    """One TensorFlow task per pod, as TF_CONFIG names them: Chief?, Worker per node, PS (ps × nodes)."""
    nodes, opts = job.nodes, job.tensorflow
    chief = 1 if opts.chief else 0
    workers, ps = nodes - chief, opts.ps * nodes
    longest = max([f"-worker-{workers - 1}" if workers else "", f"-ps-{ps - 1}" if ps else "", "-chief-0"], key=len)
    name = k8s_name(job, longest)
    restart, backoff = kubeflow_restart(job)
    ports = engine_ports(job, engine, "tfjob")
    trainer = pod_template(job, engine, name, ContainerSpec(name="tensorflow", ports=ports))
    replicas: dict[str, Any] = {}
    if chief:
        replicas["Chief"] = _replica(1, restart, trainer)
    if workers:
        replicas["Worker"] = _replica(workers, restart, trainer)
    if ps:
        server = pod_template(job, engine, name, ContainerSpec(name="tensorflow", ports=ports, accelerators=False))
        replicas["PS"] = _replica(ps, restart, server)
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
        "spec": {"runPolicy": _run_policy(job, nodes + ps, backoff), "tfReplicaSpecs": replicas},
    }
    return Manifest("tfjob", [document], notes)


def mpijob(job: Job, engine: str) -> Manifest:
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
    ports = engine_ports(job, engine, "mpijob")

    def template(index_env: dict[str, Any]) -> dict[str, Any]:
        spec = ContainerSpec(name="mlaunch", ports=ports, env=[*keys_env, *hosts, index_env], extra=mounts)
        return pod_template(job, engine, name, spec)

    replicas = {"Launcher": _replica(1, restart, template({"name": "VC_TASK_INDEX", "value": str(nodes - 1)}))}
    if nodes > 1:
        worker_index = downward_env("VC_TASK_INDEX", f"metadata.labels['{REPLICA_INDEX_LABEL}']")
        replicas["Worker"] = _replica(nodes - 1, restart, template(worker_index))
    document = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": metadata(job, name),
        "spec": {
            "slotsPerWorker": job.procs_per_node,
            "runLauncherAsWorker": True,  # the launcher pod holds accelerators and runs ranks too
            "mpiImplementation": "OpenMPI",
            "runPolicy": _run_policy(job, nodes, backoff),
            "mpiReplicaSpecs": replicas,
        },
    }
    return Manifest("mpijob", [document], [note])


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


def ascendjob(job: Job, engine: str) -> Manifest:
    nodes, k8s = job.nodes, job.kubernetes
    framework = "pytorch" if engine == "pytorch" else "mindspore"
    leader = "Master" if framework == "pytorch" else "Scheduler"
    name = k8s_name(job, f"-worker-{nodes - 2}" if nodes > 2 else f"-{leader.lower()}-0")
    if job.restart.max_restarts > 100:
        raise UserError(
            f"{_where(job)}restart.max_restarts is {job.restart.max_restarts}; MindCluster's fault-retry-times "
            "allows 0..100"
        )
    if not k8s.accelerator:
        job = job.model_copy(deep=True)
        job.kubernetes.accelerator = DEFAULT_NPU
    ring = {"ring-controller.atlas": k8s.ring_controller}
    spec = ContainerSpec(name="ascend", ports=engine_ports(job, engine, "ascendjob"))
    extra_docs = []
    if engine == "ascend" and ascend_style(job) == "rank_table":
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
    replicas = {leader: _replica(1, "Never", template)}
    if nodes > 1:
        replicas["Worker"] = _replica(nodes - 1, "Never", template)
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
    return Manifest("ascendjob", [document, *extra_docs], notes)


BUILDERS = {"volcano": volcano, "pytorchjob": pytorchjob, "tfjob": tfjob, "mpijob": mpijob, "ascendjob": ascendjob}


def build(job: Job, target: str, engine: str) -> Manifest:
    """The manifest documents for ``target``; user mistakes raise UserError before anything is written."""
    check_target(job, target, engine)
    if job.high_availability.enabled:  # pods that would refuse to start are refused here already
        from launchers.engines.high_availability import check_high_availability

        check_high_availability(job, job.nodes * job.procs_per_node)
    return BUILDERS[target](job, engine)


# ----------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------


def render(manifest: Manifest, job: Job, engine: str, output: str | None = None) -> str:
    """Multi-document YAML with a header saying where it came from and how to apply it."""
    import yaml

    source = job.source.name if job.source else "job.yaml"
    header = [
        f"# Generated by `mlaunch manifest --target {manifest.target}` from {source} (engine {engine}).",
        f"# Apply: kubectl apply -f {output or 'FILE'}",
        *(f"# Note: {note}" for note in manifest.notes),
    ]

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # shared templates are written out, never as &anchors
            return True

    body = "---\n".join(
        yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)
        for doc in manifest.documents
    )
    return "\n".join(header) + "\n---\n" + body
