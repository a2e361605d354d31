"""Round trip: the manifest, what each operator injects into pod i, and what mlaunch plans there.

This is the contract between ``mlaunch manifest`` and the launcher, tested without a
cluster. For every target, engine and 1, 2 and 4 nodes, the test reads the generated
manifest (replica types and counts, container names, named ports, the template's own env),
computes the env each operator puts into each pod by its documented rules
(platform_spec.md: Kubeflow's envvar.go, TF_CONFIG, Volcano's env/svc plugins,
ascend-operator's env.go and the rank table MindCluster writes), plans each pod with that env
alone, and checks that all pods together give ranks 0..N-1 exactly once, one world size and
one master. The operators themselves are simulated — that is what cannot run here; the
launcher side is the real ``make_plan`` (and the real ``mlaunch plan --json`` for one case
per target).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import clean_env, run_mlaunch

from launchers.config.job import Job, load_job
from launchers.errors import UserError
from launchers.generate.k8s.manifests import TARGETS, build, render
from launchers.generate.k8s.parts import RANK_TABLE_FILE
from launchers.plan import LaunchPlan
from launchers.run.runner import make_plan

NAMESPACE = "ml"
JOB_UID = "6f1c0a4e-1b2c-4d5e-8f90-0123456789ab"
FAKE_TASKD = Path(__file__).resolve().parent / "fake_taskd"


def engine_missing(engine: str) -> str | None:
    from launchers.engines import get_engine

    try:
        get_engine(engine)
    except UserError:
        return f"the {engine} engine (launchers/engines/{engine}.py) is missing"
    return None


# ----------------------------------------------------------------------------------------
# Reading the manifest
# ----------------------------------------------------------------------------------------


@dataclass
class Pod:
    """One pod the operator creates from the manifest."""

    rtype: str  # replica type / Volcano task name, as written in the manifest
    index: int  # index within that replica type
    name: str
    ip: str
    container: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)


def replica_specs(doc: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """(replica type, replicas, template) in the manifest's order."""
    spec = doc["spec"]
    if doc["kind"] == "Job":
        return [(t["name"], t["replicas"], t["template"]) for t in spec["tasks"]]
    key = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}.get(
        doc["kind"], "replicaSpecs"
    )
    return [(rtype, r["replicas"], r["template"]) for rtype, r in spec[key].items()]


def named_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container.get("ports", []) if p["name"] == name]
    return int(port)


def template_env(container: dict[str, Any], pod_ip: str, pod_name: str, labels: dict[str, str]) -> dict[str, str]:
    """The container's own env as the kubelet resolves it (downward API included)."""
    env: dict[str, str] = {}
    fields = {"status.podIP": pod_ip, "metadata.name": pod_name}
    fields.update({f"metadata.labels['{key}']": value for key, value in labels.items()})
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif "secretKeyRef" in entry["valueFrom"]:  # resolved from the manifest's Secret (``resolve_secrets``)
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = f"{SECRET_REF}{ref['name']}/{ref['key']}"
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


SECRET_REF = "secret-ref:"


def resolve_secrets(pods: list[Pod], documents: list[dict[str, Any]]) -> None:
    """The kubelet's part: each secretKeyRef as the value the manifest's Secret holds (a missing one fails)."""
    held = {
        f"{d['metadata']['name']}/{key}": value
        for d in documents
        if d["kind"] == "Secret"
        for key, value in d.get("stringData", {}).items()
    }
    for pod in pods:
        for name, value in pod.env.items():
            if value.startswith(SECRET_REF):
                pod.env[name] = held[value.removeprefix(SECRET_REF)]


def pods_of(
    doc: dict[str, Any],
    name_of: Callable[[str, int], str],
    labels_of: Callable[[str, int], dict[str, str]] | None = None,
) -> list[Pod]:
    """The pods of every replica type; ``labels_of`` gives the labels the operator adds to pod i."""
    pods = []
    for rtype, replicas, template in replica_specs(doc):
        for i in range(replicas):
            ip = f"10.244.{len(pods) // 200}.{10 + len(pods) % 200}"
            container = template["spec"]["containers"][0]
            pod = Pod(rtype, i, name_of(rtype, i), ip, container)
            labels = {**template["metadata"].get("labels", {}), **(labels_of(rtype, i) if labels_of else {})}
            pod.env = template_env(container, ip, pod.name, labels)
            pods.append(pod)
    return pods


# ----------------------------------------------------------------------------------------
# The operators' rules
# ----------------------------------------------------------------------------------------


def volcano_env(doc: dict[str, Any], tmp_path: Path) -> list[Pod]:
    """env plugin: VK_TASK_INDEX/VC_TASK_INDEX; svc plugin: VC_<TASK>_HOSTS/_NUM of every task."""
    job = doc["metadata"]["name"]
    assert {"env", "svc"} <= set(doc["spec"]["plugins"])
    pods = pods_of(doc, lambda task, i: f"{job}-{task}-{i}")
    hosts_env: dict[str, str] = {}
    for task, replicas, _ in replica_specs(doc):
        key = task.upper().replace("-", "_")
        hosts_env[f"VC_{key}_HOSTS"] = ",".join(f"{job}-{task}-{i}.{job}" for i in range(replicas))
        hosts_env[f"VC_{key}_NUM"] = str(replicas)
    for pod in pods:
        pod.env.update({"VK_TASK_INDEX": str(pod.index), "VC_TASK_INDEX": str(pod.index), **hosts_env})
    return pods


def pytorchjob_env(doc: dict[str, Any], tmp_path: Path) -> list[Pod]:
    """training-operator v1 pytorch/envvar.go + master.go."""
    job, spec = doc["metadata"]["name"], doc["spec"]
    pods = pods_of(doc, lambda rtype, i: f"{job}-{rtype.lower()}-{i}")
    master = [p for p in pods if p.rtype == "Master"][0]
    assert master.container["name"] == "pytorch"
    port = named_port(master.container, "pytorchjob-port")
    nproc_raw = spec.get("nprocPerNode", "")
    nproc = int(nproc_raw) if str(nproc_raw).isdigit() else 1
    replicas = sum(r for _, r, _ in replica_specs(doc))
    for pod in pods:
        rank = pod.index + (1 if pod.rtype == "Worker" else 0)
        pod.env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "MASTER_PORT": str(port),
                "PET_MASTER_PORT": str(port),
                "MASTER_ADDR": f"{job}-master-0",
                "PET_MASTER_ADDR": f"{job}-master-0",
                "WORLD_SIZE": str(replicas * nproc),
                "RANK": str(rank),
                "PET_NODE_RANK": str(rank),
                "PET_NNODES": str(replicas),
            }
        )
        if nproc_raw:
            pod.env["PET_NPROC_PER_NODE"] = str(nproc_raw)
    return pods


def tfjob_env(doc: dict[str, Any], tmp_path: Path) -> list[Pod]:
    """training-operator v1 tensorflow.go: TF_CONFIG on container `tensorflow` when distributed."""
    job = doc["metadata"]["name"]
    namespace = doc["metadata"]["namespace"]
    pods = pods_of(doc, lambda rtype, i: f"{job}-{rtype.lower()}-{i}")
    cluster: dict[str, list[str]] = {}
    for rtype, replicas, template in replica_specs(doc):
        port = named_port(template["spec"]["containers"][0], "tfjob-port")
        cluster[rtype.lower()] = [f"{job}-{rtype.lower()}-{i}.{namespace}.svc:{port}" for i in range(replicas)]
    if len(pods) > 1:
        for pod in pods:
            assert pod.container["name"] == "tensorflow"
            config = {
                "cluster": cluster,
                "task": {"type": pod.rtype.lower(), "index": pod.index},
                "environment": "cloud",
            }
            pod.env["TF_CONFIG"] = json.dumps(config)
    return pods


def ascendjob_env(doc: dict[str, Any], tmp_path: Path) -> list[Pod]:
    """ascend-operator env.go: pod rank, leader Service IP, NPU counts; the rank table MindCluster writes."""
    job = doc["metadata"]["name"]
    framework = doc["metadata"]["labels"]["framework"]
    pods = pods_of(doc, lambda rtype, i: f"{job}-{rtype.lower()}-{i}")
    leader = pods[0]
    assert leader.rtype in ("Master", "Scheduler") and leader.container["name"] == "ascend"
    port = named_port(leader.container, "ascendjob-port")
    service_ip = "10.96.0.20"  # the leader's ClusterIP Service
    npu_pods = [p for p in pods if any(k.startswith("huawei.com/") for k in p.container["resources"]["requests"])]

    def npus(pod: Pod) -> int:
        return int(next(v for k, v in pod.container["resources"]["requests"].items() if k.startswith("huawei.com/")))

    for rank, pod in enumerate(pods):  # leader 0, workers after it (the leader holds NPUs)
        assert pod in npu_pods
        ct = npus(pod)
        pod.env.update(
            {
                "MINDX_TASK_ID": JOB_UID,
                "MINDX_SERVER_IP": "10.96.0.2",
                "HostNetwork": "false",
                "ASCEND_VISIBLE_DEVICES": ",".join(str(d) for d in range(ct)),
            }
        )
        if framework == "pytorch":
            pod.env.update(
                {
                    "LOCAL_WORLD_SIZE": str(ct),
                    "WORLD_SIZE": str(ct * len(npu_pods)),
                    "LOCAL_RANK": ",".join(str(d) for d in range(ct)),
                    "MASTER_ADDR": service_ip,
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                }
            )
        else:
            pod.env.update(
                {
                    "MS_SCHED_HOST": pod.ip if pod is leader else service_ip,
                    "MS_LOCAL_WORKER": str(ct),
                    "MS_WORKER_NUM": str(ct * len(npu_pods)),
                    "MS_NODE_RANK": str(rank),
                    "MS_SCHED_PORT": str(port),
                    "MS_SERVER_NUM": "0",
                    "MS_ROLE": "MS_SCHED" if pod is leader else "MS_WORKER",
                    "NPU_POD": "true",
                }
            )
    if any(p.env.get("RANK_TABLE_FILE") == RANK_TABLE_FILE for p in pods):
        write_mindcluster_rank_table(pods, npus, tmp_path)
    return pods


def write_mindcluster_rank_table(pods: list[Pod], npus: Callable[[Pod], int], tmp_path: Path) -> None:
    """hccl.json as MindCluster fills ConfigMap rings-config-<job>: one server per pod, container_ip = pod IP."""
    servers, rank = [], 0
    for k, pod in enumerate(pods):
        devices = []
        for d in range(npus(pod)):
            devices.append({"device_id": str(d), "device_ip": f"192.168.{k}.{d + 1}", "rank_id": str(rank)})
            rank += 1
        servers.append(
            {
                "server_id": f"172.16.0.{100 + k}",
                "host_ip": f"172.16.0.{100 + k}",
                "container_ip": pod.ip,
                "device": devices,
            }
        )
    table = {"status": "completed", "version": "1.0", "server_count": str(len(servers)), "server_list": servers}
    path = tmp_path / "hccl.json"  # what the pods see at /user/serverid/devindex/config/hccl.json
    path.write_text(json.dumps(table))
    for pod in pods:
        assert pod.env["RANK_TABLE_FILE"] == RANK_TABLE_FILE
        pod.env["RANK_TABLE_FILE"] = str(path)


def volcano_rank_table(doc: dict[str, Any], tmp_path: Path) -> list[Pod]:
    """Volcano + Ascend device plugin: the same hccl.json in rings-config-<job>, pods in task-index order."""
    pods = volcano_env(doc, tmp_path)
    if any(p.env.get("RANK_TABLE_FILE") == RANK_TABLE_FILE for p in pods):
        limits = pods[0].container["resources"]["requests"]
        count = int(next((v for k, v in limits.items() if k.startswith("huawei.com/")), 0)) if limits else 0
        write_mindcluster_rank_table(pods, lambda pod: count or 2, tmp_path)
    return pods


def mpijob_env(doc: dict[str, Any], tmp_path: Path) -> list[Pod]:
    """MPI Operator v2beta1: launcher/worker env, the worker's replica-index label (newWorker)."""
    job, spec = doc["metadata"]["name"], doc["spec"]
    assert spec["runLauncherAsWorker"] is True

    def labels(rtype: str, i: int) -> dict[str, str]:
        role = rtype.lower()
        found = {"training.kubeflow.org/job-name": job, "training.kubeflow.org/job-role": role}
        if rtype == "Worker":
            found["training.kubeflow.org/replica-index"] = str(i)
        return found

    pods = pods_of(doc, lambda rtype, i: f"{job}-launcher" if rtype == "Launcher" else f"{job}-worker-{i}", labels)
    for pod in pods:
        if pod.rtype == "Launcher":
            pod.env.update(
                {
                    "K_MPI_JOB_ROLE": "launcher",
                    "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
                    "OMPI_MCA_orte_set_default_slots": str(spec["slotsPerWorker"]),
                }
            )
        else:
            pod.env["K_MPI_JOB_ROLE"] = "worker"
    return pods


OPERATORS: dict[str, Callable[[dict[str, Any], Path], list[Pod]]] = {
    "mpijob": mpijob_env,
    "volcano": volcano_rank_table,
    "pytorchjob": pytorchjob_env,
    "tfjob": tfjob_env,
    "ascendjob": ascendjob_env,
}


# ----------------------------------------------------------------------------------------
# The check
# ----------------------------------------------------------------------------------------


def write_job(tmp_path: Path, engine: str, nodes: int, procs: int, extra: dict[str, Any] | None = None) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    data: dict[str, Any] = {
        "name": "rt",
        "engine": engine,
        "entry": "train.py",
        "nodes": nodes,
        "procs_per_node": procs,
        "kubernetes": {"image": "img:1", "namespace": NAMESPACE},
    }
    if engine == "ascend":
        data["kubernetes"]["accelerator"] = "huawei.com/Ascend910"
    data.update(extra or {})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def manifest_docs(job: Job, target: str, engine: str) -> list[dict[str, Any]]:
    text = render(build(job, target, engine), job, engine)
    return [d for d in yaml.safe_load_all(text) if d]


def canonical(addr: str, pods: list[Pod]) -> str:
    """A master named by pod IP, Service IP or DNS name, as the pod it reaches (the first, leader pod)."""
    if addr in ("10.96.0.20", pods[0].ip) or addr.split(".")[0] == pods[0].name:
        return pods[0].name
    return addr


@dataclass
class RoundTrip:
    plans: list[LaunchPlan]
    pods: list[Pod]

    def identities(self) -> list[tuple[str, int]]:
        """(role, index) of every TensorFlow task the pods start."""
        return [(p.role, p.rank) for plan in self.plans for p in plan.processes if p.role in ("chief", "worker", "ps")]


def round_trip(
    tmp_path: Path, target: str, engine: str, nodes: int, procs: int, extra: dict[str, Any] | None = None
) -> RoundTrip:
    job_file = write_job(tmp_path, engine, nodes, procs, extra)
    job = load_job(job_file)
    documents = manifest_docs(job, target, engine)
    doc = documents[0]
    pods = OPERATORS[target](doc, tmp_path)
    resolve_secrets(pods, documents)
    assert len({pod.env["MLAUNCH_JOB_SECRET"] for pod in pods}) == 1  # one key, in every pod
    if any("MLAUNCH_SSH_KEYS" in pod.env for pod in pods):  # the mounted Secret made by `mlaunch keys`
        from bootstrap.keys import generate

        keys = tmp_path / "job-ssh"
        if not keys.exists():
            generate(keys)
        for pod in pods:
            pod.env["MLAUNCH_SSH_KEYS"] = str(keys)
    # The container's own command: mlaunch --engine E <job.yaml in the container> (here: the file itself).
    command = pods[0].container["command"]
    assert command[:3] == ["mlaunch", "--engine", engine] and command[3].endswith("/job.yaml")
    plans = [make_plan(job, engine, [], pod.env)[2] for pod in pods]
    for plan in plans:  # every pod read the platform (TFJob sets no TF_CONFIG for a lone pod)
        assert not plan.simulated or (target == "tfjob" and len(pods) == 1), (plan.source, plan.notes)
    return RoundTrip(plans, pods)


def assert_one_job(rt: RoundTrip, world: int) -> None:
    ranks = sorted(p.rank for plan in rt.plans for p in plan.processes if p.role == "worker")
    assert ranks == list(range(world)), ranks
    assert {plan.world_size for plan in rt.plans} == {world}
    masters = {(canonical(plan.master_addr, rt.pods), plan.master_port) for plan in rt.plans}
    assert len(masters) == 1, masters


NODES = [1, 2, 4]


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("target", ["volcano", "pytorchjob", "ascendjob"])
def test_pytorch_round_trip(tmp_path: Path, target: str, nodes: int) -> None:
    rt = round_trip(tmp_path, target, "pytorch", nodes, 2)
    assert_one_job(rt, nodes * 2)
    source = {"volcano": "volcano", "pytorchjob": "kubeflow-pytorchjob", "ascendjob": "mindcluster"}[target]
    assert {plan.source for plan in rt.plans} == {source}
    for pod, plan in zip(rt.pods, rt.plans, strict=True):
        assert [n.index for n in plan.nodes] == [rt.pods.index(pod)]  # pod i is node i


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("style", ["rank_table", "msrun"])
@pytest.mark.parametrize("target", ["ascendjob", "volcano"])
def test_ascend_round_trip(tmp_path: Path, target: str, style: str, nodes: int) -> None:
    if reason := engine_missing("ascend"):
        pytest.skip(reason)
    rt = round_trip(tmp_path, target, "ascend", nodes, 2, {"ascend": {"style": style}})
    assert_one_job(rt, nodes * 2)
    if style == "msrun":
        schedulers = [i for i, plan in enumerate(rt.plans) for p in plan.processes if p.role == "scheduler"]
        assert schedulers == [0]  # one MindSpore scheduler, on the leader pod


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("chief", [False, True])
@pytest.mark.parametrize("target", ["tfjob", "volcano"])
def test_tensorflow_round_trip(tmp_path: Path, target: str, chief: bool, nodes: int) -> None:
    if reason := engine_missing("tensorflow"):
        pytest.skip(reason)
    rt = round_trip(tmp_path, target, "tensorflow", nodes, 1, {"tensorflow": {"ps": 1, "chief": chief}})
    workers = nodes - (1 if chief else 0)
    expected = sorted(
        [("chief", 0)] * chief + [("worker", i) for i in range(workers)] + [("ps", i) for i in range(nodes)]
    )
    assert sorted(rt.identities()) == expected
    assert {plan.world_size for plan in rt.plans} == {nodes}
    masters = {(canonical(plan.master_addr, rt.pods), plan.master_port) for plan in rt.plans}
    assert len(masters) == 1, masters
    configs = {
        json.dumps(json.loads(p.env["TF_CONFIG"])["cluster"], sort_keys=True)
        for plan in rt.plans
        for p in plan.processes
        if "TF_CONFIG" in p.env
    }
    assert len(configs) == 1  # every task sees the same cluster


@pytest.mark.parametrize("nodes", NODES)
@pytest.mark.parametrize("target", ["mpijob", "volcano"])
def test_mpi_round_trip(tmp_path: Path, target: str, nodes: int) -> None:
    """Node 0 runs mpirun over every node's slots; every other pod waits for its exit code (control plane)."""
    if reason := engine_missing("mpi"):
        pytest.skip(reason)
    procs = 2
    rt = round_trip(tmp_path, target, "mpi", nodes, procs)
    by_node = {int(pod.env["VC_TASK_INDEX"]): (pod, plan) for pod, plan in zip(rt.pods, rt.plans, strict=True)}
    assert sorted(by_node) == list(range(nodes))  # pod i is node i, each index once
    hosts = rt.pods[0].env["VC_WORKER_HOSTS"].split(",")
    heads = [n for n, (_, plan) in by_node.items() for p in plan.processes if p.role == "mpirun"]
    assert heads == [0]
    _, head = by_node[0]
    (mpirun,) = head.processes
    np = int(mpirun.argv[mpirun.argv.index("-np") + 1])
    assert np == nodes * procs
    if nodes > 1:
        (hostfile,) = [s.params for s in head.nodes[0].bootstrap if s.name == "hostfile"]
        assert hostfile["hosts"] == hosts and hostfile["slots"] == procs
        # -map-by slot fills each host's slots in order: host i holds ranks i*procs .. i*procs+procs-1
        ranks = [i * procs + k for i in range(len(hostfile["hosts"])) for k in range(hostfile["slots"])]
        assert sorted(ranks) == list(range(np))
        for node in range(1, nodes):
            _, plan = by_node[node]
            (peer,) = plan.processes
            assert peer.role == "peer"
            assert peer.argv[peer.argv.index("--node0") + 1] == hosts[0]
            (completion,) = [s.params for s in plan.nodes[0].bootstrap if s.name == "completion"]
            assert completion["node0"] == hosts[0] and plan.nodes[0].host == hosts[node]
    assert {plan.world_size for plan in rt.plans} == {nodes * procs}
    assert len({plan.master_addr for plan in rt.plans}) == 1


@pytest.mark.parametrize("target", ["volcano", "pytorchjob", "ascendjob"])
def test_taskd_manager_is_on_exactly_one_pod(tmp_path: Path, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """High availability across pods: the TaskD manager runs on pod 0 only (fake taskd on the path)."""
    monkeypatch.syspath_prepend(str(FAKE_TASKD))
    rt = round_trip(tmp_path, target, "pytorch", 4, 2, {"high_availability": {"taskd": True, "dp": 8}})
    managers = [i for i, plan in enumerate(rt.plans) for p in plan.processes if p.role == "taskd-manager"]
    assert managers == [0]
    for pod in rt.pods:
        assert "taskd-port" in {p["name"] for p in pod.container["ports"]}
    (_, manager) = next((i, p) for i, plan in enumerate(rt.plans) for p in plan.processes if p.role == "taskd-manager")
    node_nums = manager.argv[manager.argv.index("--node-nums") + 1]
    assert node_nums == "4"


@pytest.mark.parametrize(
    ("target", "engine", "extra"),
    [
        ("volcano", "pytorch", {}),
        ("pytorchjob", "pytorch", {}),
        ("ascendjob", "pytorch", {}),
        ("ascendjob", "ascend", {"ascend": {"style": "rank_table"}}),
        ("tfjob", "tensorflow", {"tensorflow": {"ps": 1}}),
        ("mpijob", "mpi", {}),
    ],
)
def test_the_real_cli_agrees(tmp_path: Path, target: str, engine: str, extra: dict[str, Any]) -> None:
    """One case per target through `mlaunch plan --json` with only the operator's env (plus PATH etc.)."""
    if reason := engine_missing(engine):
        pytest.skip(reason)
    rt = round_trip(tmp_path, target, engine, 2, 1 if engine == "tensorflow" else 2, extra)
    job_file = tmp_path / "job.yaml"
    seen = []
    for pod, plan in zip(rt.pods, rt.plans, strict=True):
        result = run_mlaunch(
            ["plan", "--json", "--engine", engine, str(job_file)], env=clean_env(**pod.env), timeout=60
        )
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["world_size"] == plan.world_size and data["master_addr"] == plan.master_addr
        procs = [p for node in data["nodes"] for p in node["processes"]]
        assert [(p["role"], p["rank"]) for p in procs] == [(p.role, p.rank) for p in plan.processes]
        seen += [(p["role"], p["rank"]) for p in procs]
    assert len(seen) == len(set(seen))


def test_round_trip_covers_every_target() -> None:
    covered = {"volcano", "pytorchjob", "tfjob", "ascendjob", "mpijob", "trainjob"}  # trainjob: test_trainjob.py
    assert covered == set(TARGETS)
    assert os.path.isdir(FAKE_TASKD)
