"""`mlaunch manifest`: every target validated strictly against its real CRD, core kinds with
kubernetes-validate, the semantics each operator relies on, the refusals, and no secret leaks.

Strict CRD validation is what ``kubectl apply --validate=strict`` would say: the CRD's
``openAPIV3Schema`` with ``additionalProperties: false`` wherever ``properties`` is listed
(unless ``x-kubernetes-preserve-unknown-fields``), ``nullable`` turned into a null type,
checked with jsonschema's Draft7Validator. Each pod template and the job's metadata are also
checked against Kubernetes' own schemas (as a v1 PodTemplate) with kubernetes-validate in
strict mode, where a missing schema is a failure, not a pass.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, SHARED, clean_env, run_mlaunch

from launchers.config.job import Job, load_job
from launchers.errors import UserError
from launchers.generate.k8s.manifests import TARGETS, build, render

CRDS = SHARED / "crds"
needs_crds = pytest.mark.skipif(
    not CRDS.is_dir(), reason=f"CRD folder {CRDS} is absent (it lives beside the project, not in a user's checkout)"
)
CRD_FILES = {
    "volcano": ("batch.volcano.sh_jobs.yaml", "v1alpha1"),
    "pytorchjob": ("kubeflow.org_pytorchjobs.yaml", "v1"),
    "tfjob": ("kubeflow.org_tfjobs.yaml", "v1"),
    "mpijob": ("kubeflow.org_mpijobs.v2beta1.yaml", "v2beta1"),
    "ascendjob": ("ascendjobs.mindxdl.gitee.com.yaml", "v1"),
    "trainjob": ("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
    # the runtime a TrainJob names is checked against its own CRD (looked up by kind)
    "TrainingRuntime": ("trainer.kubeflow.org_trainingruntimes.yaml", "v1alpha1"),
    "ClusterTrainingRuntime": ("trainer.kubeflow.org_clustertrainingruntimes.yaml", "v1alpha1"),
}
JOBSET_CRD = ("jobset.x-k8s.io_jobsets.v0.12.0.yaml", "v1alpha2")
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
K8S_VERSION = "1.37.0"
EXAMPLES = ROOT / "examples" / "k8s"


# ----------------------------------------------------------------------------------------
# Validators
# ----------------------------------------------------------------------------------------

_SCHEMA_MAPS = ("properties", "patternProperties", "definitions")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def strict_schema(schema: Any) -> Any:
    """The CRD schema as the API server's strict field validation sees it."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict_schema(sub) for name, sub in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(sub) for sub in out[key]]
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
        elif isinstance(out.get(key), list):
            out[key] = [strict_schema(sub) for sub in out[key]]
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in out
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator(target: str) -> Any:
    from jsonschema import Draft7Validator

    filename, version = JOBSET_CRD if target == "JobSet" else CRD_FILES[target]
    with open(CRDS / filename, encoding="utf-8") as fh:
        docs = [
            d for d in yaml.load_all(fh, Loader=yaml.CSafeLoader) if d and d.get("kind") == "CustomResourceDefinition"
        ]
    (crd,) = docs
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return Draft7Validator(strict_schema(entry["schema"]["openAPIV3Schema"]))


def crd_errors(target: str, document: dict[str, Any]) -> list[str]:
    """Errors against the target's CRD (a Trainer runtime: its own CRD, and its template as a JobSet v0.12.0)."""
    kind = document.get("kind")
    key = kind if kind in RUNTIME_KINDS else target
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in crd_validator(key).iter_errors(document)]
    if kind in RUNTIME_KINDS:
        jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"}}
        jobset["spec"] = document.get("spec", {}).get("template", {}).get("spec", {})
        errors += [f"JobSet {e}" for e in crd_errors("JobSet", jobset)]
    return errors


def core_validate(document: dict[str, Any]) -> None:
    """kubernetes-validate, strict; SchemaNotFoundError propagates (a failure, never a pass)."""
    import kubernetes_validate

    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def pod_templates(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    spec = document["spec"]
    if document["kind"] == "Job":
        for task in spec["tasks"]:
            yield task["name"], task["template"]
        return
    if document["kind"] in RUNTIME_KINDS:
        for replicated in spec["template"]["spec"]["replicatedJobs"]:
            yield replicated["name"], replicated["template"]["spec"]["template"]
        return
    if document["kind"] in ("TrainJob", "JobSet"):
        return
    key = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}.get(
        document["kind"], "replicaSpecs"
    )
    for role, replica in spec[key].items():
        yield role, replica["template"]


def validate_all(target: str, documents: list[dict[str, Any]]) -> None:
    """The job against its CRD; its templates and metadata as core objects; other kinds with kubernetes-validate."""
    job, *others = documents
    if job["kind"] in RUNTIME_KINDS:  # a TrainJob's runtime comes first: Trainer wants it to exist already
        others, job = [job, *others[1:]], others[0]
    for document in [job, *(o for o in others if o["kind"] in RUNTIME_KINDS)]:
        errors = crd_errors(target, document)
        assert not errors, "\n".join(errors[:10])
        for role, template in pod_templates(document):
            core_validate(
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {**job["metadata"], "name": f"x-{role.lower()}"},
                    "template": template,
                }
            )
    for other in others:
        assert other["kind"] in ("ConfigMap", "Service", "Secret", *RUNTIME_KINDS), other["kind"]
        if other["kind"] not in RUNTIME_KINDS:
            core_validate(other)


# ----------------------------------------------------------------------------------------
# Jobs
# ----------------------------------------------------------------------------------------


def write_job(tmp_path: Path, engine: str, nodes: int = 2, procs: int = 2, **sections: Any) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    data: dict[str, Any] = {
        "name": "demo",
        "engine": engine,
        "entry": "train.py",
        "nodes": nodes,
        "procs_per_node": procs,
    }
    data["kubernetes"] = {"image": "registry.example.com/ml/train:1.0", **sections.pop("kubernetes", {})}
    data.update(sections)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def documents_of(job_file: Path, target: str, engine: str | None = None) -> list[dict[str, Any]]:
    """Build, render to YAML text, and parse it back (what kubectl would read)."""
    job = load_job(job_file)
    engine = engine or job.engine or ""
    text = render(build(job, target, engine), job, engine)
    return [d for d in yaml.safe_load_all(text) if d is not None]


PAIRS = [(target, engine) for target, engines in TARGETS.items() for engine in engines]

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "volumes-and-resources": {
        "kubernetes": {
            "cpu": "7500m",
            "memory": "60Gi",
            "accelerator": "nvidia.com/gpu",
            "shm_size": "4Gi",
            "code": {"pvc": "code", "read_only": True},
            "output": {"host_path": "/data/out", "sub_path": "demo"},
            "node_selector": {"accelerator-type": "module-910b-8"},
            "env_from_secrets": ["creds"],
            "image_pull_secrets": ["registry"],
            "namespace": "team-a",
            "queue": "research",
        },
        "restart": {"max_restarts": 3},
    },
    "high-availability": {"high_availability": {"taskd": True, "ttp": True, "dp": 0}},  # dp filled per case
}


@needs_crds
@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("target", "engine"), PAIRS, ids=[f"{t}-{e}" for t, e in PAIRS])
def test_every_target_validates_against_its_crd(
    tmp_path: Path, target: str, engine: str, variant: str, nodes: int
) -> None:
    sections = copy.deepcopy(VARIANTS[variant])
    if "high_availability" in sections:
        sections["high_availability"]["dp"] = nodes * 2
    documents = documents_of(write_job(tmp_path, engine, nodes, **sections), target)
    validate_all(target, documents)


@needs_crds
@pytest.mark.parametrize(
    ("example", "target"),
    [
        ("pytorch.yaml", "pytorchjob"),
        ("pytorch.yaml", "volcano"),
        ("tensorflow.yaml", "tfjob"),
        ("tensorflow.yaml", "volcano"),
        ("mpi.yaml", "mpijob"),
        ("mpi.yaml", "volcano"),
        ("ascend.yaml", "ascendjob"),
        ("ascend.yaml", "volcano"),
        ("mindspore-ha.yaml", "ascendjob"),
        ("pytorch-taskd.yaml", "ascendjob"),
    ],
)
def test_the_examples_validate(example: str, target: str) -> None:
    validate_all(target, documents_of(EXAMPLES / example, target))


@needs_crds
@pytest.mark.parametrize("target", list(TARGETS))
def test_the_strict_validator_catches_unknown_fields(tmp_path: Path, target: str) -> None:
    """The validation above must be able to fail: a typo deep in the pod template and one in the spec."""
    engine = TARGETS[target][0]
    (job, *_) = documents_of(write_job(tmp_path, engine), target)
    _, template = next(pod_templates(job))
    template["spec"]["containers"][0]["imagee"] = "typo"
    assert any("imagee" in e for e in crd_errors(target, job))
    (job, *_) = documents_of(write_job(tmp_path, engine), target)
    job["spec"]["replicaz"] = 2
    assert any("replicaz" in e for e in crd_errors(target, job))


def test_core_validation_treats_a_missing_schema_as_a_failure() -> None:
    import kubernetes_validate

    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        core_validate({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x"}})


# ----------------------------------------------------------------------------------------
# What each operator relies on
# ----------------------------------------------------------------------------------------


def containers(document: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(role, t["spec"], t["spec"]["containers"][0]) for role, t in pod_templates(document)]


@pytest.mark.parametrize(("target", "engine"), PAIRS, ids=[f"{t}-{e}" for t, e in PAIRS])
def test_every_pod_reads_a_random_job_key_from_the_manifests_secret(tmp_path: Path, target: str, engine: str) -> None:
    """Contract (issue 47): a Secret with a random key, new at each generation; every pod reads it."""
    job_file = write_job(tmp_path, engine, 3, kubernetes={"namespace": "team-a"})
    keys = []
    for _ in range(2):
        documents = documents_of(job_file, target)
        (secret,) = [d for d in documents if d["kind"] == "Secret"]
        assert secret["metadata"] == {
            "name": "demo-mlaunch-key",
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/name": "demo", "app.kubernetes.io/managed-by": "mlaunch"},
        }
        assert secret["immutable"] is True
        keys.append(secret["stringData"]["MLAUNCH_JOB_SECRET"])
        reference = {"secretKeyRef": {"name": "demo-mlaunch-key", "key": "MLAUNCH_JOB_SECRET"}}
        templates = [t for d in documents if d["kind"] not in ("Secret", "ConfigMap") for _, t in pod_templates(d)]
        assert templates
        for template in templates:
            for container in template["spec"]["containers"]:
                (entry,) = [e for e in container["env"] if e["name"] == "MLAUNCH_JOB_SECRET"]
                assert entry == {"name": "MLAUNCH_JOB_SECRET", "valueFrom": reference}
    assert keys[0] != keys[1] and all(re.fullmatch(r"[0-9a-f]{64}", k) for k in keys)


def test_pod_contract_command_grace_shm_volumes(tmp_path: Path) -> None:
    job_file = write_job(
        tmp_path,
        "pytorch",
        checkpoint={"dir": "output/ckpt", "grace_period": "45s"},
        kubernetes={"code": {"pvc": "code"}, "output": {"pvc": "ckpt"}, "shm_size": "2Gi", "cpu": 4},
    )
    for target in ("volcano", "pytorchjob", "ascendjob"):
        (job, *_) = documents_of(job_file, target)
        for _, pod, container in containers(job):
            assert container["command"] == ["mlaunch", "--engine", "pytorch", "/job/code/job.yaml"]
            assert container["workingDir"] == "/job/code"
            assert pod["terminationGracePeriodSeconds"] == 60  # 45 s grace + 15 s margin > mlaunch's own SIGKILL
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert (
                volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"} and mounts["dshm"] == "/dev/shm"
            )
            assert volumes["code"]["persistentVolumeClaim"] == {"claimName": "code"} and mounts["code"] == "/job/code"
            assert volumes["output"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
            assert mounts["output"] == "/job/code/output/ckpt"
            assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
            assert container["resources"]["limits"] == container["resources"]["requests"]


def test_grace_period_and_margin_are_configurable(tmp_path: Path) -> None:
    job_file = write_job(
        tmp_path, "pytorch", checkpoint={"grace_period": "2m"}, kubernetes={"termination_margin": "20.5s"}
    )
    (job, *_) = documents_of(job_file, "pytorchjob")
    assert {pod["terminationGracePeriodSeconds"] for _, pod, _ in containers(job)} == {141}


def test_the_entrypoint_replaces_the_command(tmp_path: Path) -> None:
    (job, *_) = documents_of(write_job(tmp_path, "pytorch", kubernetes={"entrypoint": "entrypoint.sh"}), "volcano")
    assert containers(job)[0][2]["command"] == ["bash", "/job/code/entrypoint.sh"]


@pytest.mark.parametrize(("restarts", "retry"), [(0, 1), (3, 4)])
def test_volcano_restart_mapping(tmp_path: Path, restarts: int, retry: int) -> None:
    (job, *_) = documents_of(write_job(tmp_path, "pytorch", 4, restart={"max_restarts": restarts}), "volcano")
    spec = job["spec"]
    assert spec["maxRetry"] == retry  # Volcano counts the failing attempt, and would turn 0 into 3
    assert spec["policies"] == [{"events": ["PodEvicted", "PodFailed"], "action": "RestartJob"}]
    assert spec["plugins"] == {"env": [], "svc": []} and spec["minAvailable"] == 4
    assert spec["schedulerName"] == "volcano"
    (task,) = spec["tasks"]
    assert task["name"] == "worker" and task["replicas"] == 4  # VC_WORKER_HOSTS / VC_TASK_INDEX
    assert task["template"]["spec"]["restartPolicy"] == "Never"  # a failed container is a PodFailed event


@pytest.mark.parametrize(("restarts", "policy"), [(0, "Never"), (2, "OnFailure")])
def test_kubeflow_restart_mapping(tmp_path: Path, restarts: int, policy: str) -> None:
    for target, engine, key in (
        ("pytorchjob", "pytorch", "pytorchReplicaSpecs"),
        ("tfjob", "tensorflow", "tfReplicaSpecs"),
        ("mpijob", "mpi", "mpiReplicaSpecs"),
    ):
        (job, *_) = documents_of(write_job(tmp_path, engine, 3, restart={"max_restarts": restarts}), target)
        assert job["spec"]["runPolicy"]["backoffLimit"] == restarts
        assert {r["restartPolicy"] for r in job["spec"][key].values()} == {policy}


def test_pytorchjob_layout(tmp_path: Path) -> None:
    (job, *_) = documents_of(write_job(tmp_path, "pytorch", 4, 8, pytorch={"master_port": 29400}), "pytorchjob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Master": 1, "Worker": 3}
    assert job["spec"]["nprocPerNode"] == "8"
    for _, _, container in containers(job):
        assert container["name"] == "pytorch"  # the operator reads pytorchjob-port from this container
        assert {"containerPort": 29400, "name": "pytorchjob-port"} in container["ports"]
    (job, *_) = documents_of(write_job(tmp_path, "pytorch", 1), "pytorchjob")
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_tfjob_has_one_task_per_pod_and_cpu_only_ps(tmp_path: Path) -> None:
    job_file = write_job(
        tmp_path, "tensorflow", 3, 1, tensorflow={"ps": 2, "chief": True}, kubernetes={"accelerator": "nvidia.com/gpu"}
    )
    (job, *_) = documents_of(job_file, "tfjob")
    replicas = job["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Chief": 1, "Worker": 2, "PS": 6}
    for role, _, container in containers(job):
        assert container["name"] == "tensorflow"
        assert {"containerPort": 2222, "name": "tfjob-port"} in container["ports"]
        gpus = container["resources"]["limits"].get("nvidia.com/gpu") if "resources" in container else None
        assert gpus == (None if role == "PS" else 1)


def test_mpijob_names_hosts_and_indices_and_mounts_the_job_secret(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "mpi", 3, 4, mpi={"keys_dir": "keys", "sshd_port": 36666})
    (keys := tmp_path / "keys").mkdir()
    (keys / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nTOPSECRETKEYMATERIAL\n")
    (job, *_) = documents_of(job_file, "mpijob")
    spec = job["spec"]
    assert spec["runLauncherAsWorker"] is True and spec["slotsPerWorker"] == 4
    assert {k: v["replicas"] for k, v in spec["mpiReplicaSpecs"].items()} == {"Launcher": 1, "Worker": 2}
    hosts = "demo-worker-0.demo,demo-worker-1.demo,demo-launcher.demo"
    index = {
        "Launcher": {"name": "VC_TASK_INDEX", "value": "2"},
        "Worker": {
            "name": "VC_TASK_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['training.kubeflow.org/replica-index']"}},
        },
    }
    for role, pod, container in containers(job):
        assert {"name": "VC_WORKER_HOSTS", "value": hosts} in container["env"]
        assert index[role] in container["env"]
        assert {"containerPort": 36666, "name": "sshd"} in container["ports"]
        assert {"containerPort": 36667, "name": "mpi-done"} in container["ports"]
        assert {"name": "mlaunch-ssh", "secret": {"secretName": "demo-mlaunch-ssh", "defaultMode": 0o400}} in pod[
            "volumes"
        ]
        assert {"name": "mlaunch-ssh", "mountPath": "/job/code/keys", "readOnly": True} in container["volumeMounts"]
    text = render(build(load_job(job_file), "mpijob", "mpi"), load_job(job_file), "mpi")
    assert "TOPSECRETKEYMATERIAL" not in text and "PRIVATE KEY" not in text
    assert "kubectl create secret generic demo-mlaunch-ssh --from-file=./job-ssh -n default" in text


def test_volcano_mpi_uses_the_ssh_plugin_and_the_job_secret(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "mpi", 2, 2, kubernetes={"ssh_secret": "team-ssh"})
    (job, *_) = documents_of(job_file, "volcano")
    assert job["spec"]["plugins"] == {"env": [], "svc": [], "ssh": []}
    ((_, pod, container),) = containers(job)
    assert {"name": "MLAUNCH_SSH_KEYS", "value": "/etc/mlaunch/ssh"} in container["env"]
    assert {"name": "mlaunch-ssh", "secret": {"secretName": "team-ssh", "defaultMode": 0o400}} in pod["volumes"]


def test_ascendjob_labels_ports_and_recovery(tmp_path: Path) -> None:
    job_file = write_job(
        tmp_path,
        "pytorch",
        2,
        8,
        restart={"max_restarts": 4},
        high_availability={"taskd": True, "dp": 8, "tp": 2},
    )
    (job, *_) = documents_of(job_file, "ascendjob")
    labels = job["metadata"]["labels"]
    assert labels["framework"] == "pytorch" and labels["ring-controller.atlas"] == "ascend-910b"
    assert labels["fault-scheduling"] == "force" and labels["pod-rescheduling"] == "on"
    assert labels["process-recover-enable"] == "on" and labels["fault-retry-times"] == "4"
    assert job["metadata"]["annotations"] == {"recover-strategy": "retry"}
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano" and spec["successPolicy"] == "AllWorkers"
    assert {k: (v["replicas"], v["restartPolicy"]) for k, v in spec["replicaSpecs"].items()} == {
        "Master": (1, "Never"),
        "Worker": (1, "Never"),
    }
    for role, pod_template in pod_templates(job):
        assert pod_template["metadata"]["labels"]["ring-controller.atlas"] == "ascend-910b", role
        container = pod_template["spec"]["containers"][0]
        assert container["name"] == "ascend"
        assert container["resources"]["limits"]["huawei.com/Ascend910"] == 8
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"ascendjob-port": 2222, "taskd-port": 9601}  # TaskD's port on every pod
        assert {"name": "PROCESS_RECOVER", "value": "on"} in container["env"]


def test_ascendjob_mindspore_rank_table_and_strategy(tmp_path: Path) -> None:
    job_file = write_job(
        tmp_path, "ascend", 3, 8, ascend={"style": "rank_table"}, high_availability={"ttp": True, "arf": True, "dp": 24}
    )
    job, config_map, _key = documents_of(job_file, "ascendjob")
    assert job["metadata"]["labels"]["framework"] == "mindspore"
    assert job["metadata"]["annotations"] == {"recover-strategy": "recover,dump"}
    assert {k: v["replicas"] for k, v in job["spec"]["replicaSpecs"].items()} == {"Scheduler": 1, "Worker": 2}
    assert config_map["metadata"]["name"] == "rings-config-demo"
    assert json.loads(config_map["data"]["hccl.json"]) == {"status": "initializing"}
    for _, pod, container in containers(job):
        assert {"name": "RANK_TABLE_FILE", "value": "/user/serverid/devindex/config/hccl.json"} in container["env"]
        assert {"name": "MA_CURRENT_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container[
            "env"
        ]
        assert {"name": "ascend-910-config", "configMap": {"name": "rings-config-demo"}} in pod["volumes"]
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
            "ascendjob-port": 2222,
            "tft-port": 30051,
        }


def test_ascendjob_msrun_uses_the_scheduler_port(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "ascend", 2, 4, ascend={"style": "msrun", "sched_port": 8200})
    (job, *others) = documents_of(job_file, "ascendjob")
    assert [o["kind"] for o in others] == ["Secret"]  # no rank table for msrun: the job's key only
    for _, _, container in containers(job):
        assert {"containerPort": 8200, "name": "ascendjob-port"} in container["ports"]


# ----------------------------------------------------------------------------------------
# Refusals (exit 2, one message, nothing written)
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "target", "sections", "message"),
    [
        ("pytorch", "tfjob", {}, "target tfjob runs the tensorflow engine, but this job uses the pytorch engine"),
        ("pytorch", "kubeflow", {}, "unknown --target 'kubeflow'"),
        ("pytorch", "volcano", {"name": "My_Job"}, "job name 'My_Job' cannot name Kubernetes objects"),
        ("pytorch", "volcano", {"kubernetes": {"image": None}}, "kubernetes.image is not set"),
        (
            "pytorch",
            "volcano",
            {"kubernetes": {"memory": "lots"}},
            "kubernetes.memory: 'lots' is not a Kubernetes quantity",
        ),
        ("pytorch", "volcano", {"kubernetes": {"namespace": "Team_A"}}, "kubernetes.namespace 'Team_A'"),
        ("pytorch", "volcano", {"pytorch": {"nnodes": "2:4"}}, "elastic range"),
        ("pytorch", "ascendjob", {"restart": {"max_restarts": 101}}, "fault-retry-times allows 0..100"),
    ],
)
def test_refusals(tmp_path: Path, engine: str, target: str, sections: dict[str, Any], message: str) -> None:
    job_file = write_job(tmp_path, engine, **sections)
    out = tmp_path / "out.yaml"
    result = run_mlaunch(["manifest", "--target", target, str(job_file), "-o", str(out)], timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_job_file_outside_code_dir_needs_job_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: demo\nentry: train.py\ncode_dir: src\nkubernetes: {image: img}\n")
    with pytest.raises(UserError, match="not inside code_dir"):
        build(load_job(job_file), "volcano", "pytorch")
    job = load_job(job_file)
    job.kubernetes.job_file = "/job/job.yaml"
    (doc, *_) = build(job, "volcano", "pytorch").documents
    assert doc["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"][-1] == "/job/job.yaml"


def test_relative_paths_outside_code_dir_are_refused(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "pytorch", checkpoint={"dir": "../ckpt"}, kubernetes={"output": {"pvc": "c"}})
    with pytest.raises(UserError, match=r"checkpoint.dir: ../ckpt is outside code_dir"):
        build(load_job(job_file), "volcano", "pytorch")
    job_file = write_job(tmp_path, "pytorch", checkpoint={"dir": "/cache/ckpt"}, kubernetes={"output": {"pvc": "c"}})
    (job, *_) = documents_of(job_file, "volcano")
    ((_, pod, container),) = containers(job)
    assert {"name": "output", "mountPath": "/cache/ckpt"} in container["volumeMounts"]


def test_code_host_path_must_exist_output_is_created(tmp_path: Path) -> None:
    job_file = write_job(
        tmp_path, "pytorch", kubernetes={"code": {"host_path": "/data/code"}, "output": {"host_path": "/data/out"}}
    )
    (job, *_) = documents_of(job_file, "pytorchjob")
    volumes = {v["name"]: v for v in containers(job)[0][1]["volumes"]}
    assert volumes["code"]["hostPath"] == {"path": "/data/code", "type": "Directory"}
    assert volumes["output"]["hostPath"] == {"path": "/data/out", "type": "DirectoryOrCreate"}


def test_bad_kubernetes_keys_name_the_key(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "pytorch", kubernetes={"code": {"pvc": "a", "host_path": "/b"}})
    result = run_mlaunch(["manifest", "-t", "volcano", str(job_file)], timeout=60)
    assert result.returncode == 2 and "kubernetes.code.host_path" in result.stderr
    assert "either pvc or host_path" in result.stderr
    job_file = write_job(tmp_path, "pytorch", kubernetes={"outptu": {"pvc": "a"}})
    result = run_mlaunch(["manifest", "-t", "volcano", str(job_file)], timeout=60)
    assert result.returncode == 2 and "Did you mean 'output'?" in result.stderr


# ----------------------------------------------------------------------------------------
# The command, and secrets
# ----------------------------------------------------------------------------------------


def test_output_file_and_stdout(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "pytorch")
    out = tmp_path / "deploy" / "job.yaml"
    result = run_mlaunch(["manifest", "--target", "pytorchjob", str(job_file), "-o", str(out)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and f"wrote {out} (PyTorchJob demo, Secret demo-mlaunch-key)" in result.stderr
    assert out.stat().st_mode & 0o777 == 0o600  # it holds the job's key
    text = out.read_text()
    assert text.startswith("# Generated by `mlaunch manifest --target pytorchjob`")
    assert f"kubectl apply -f {out}" in text
    result = run_mlaunch(["manifest", "-t", "pytorchjob", str(job_file)], timeout=60)
    assert result.returncode == 0
    assert without_key(result.stdout) == without_key(text.replace(str(out), "FILE"))


KEY_LINE = re.compile(r"^(\s*MLAUNCH_JOB_SECRET: )[0-9a-f]{64}$", re.M)


def without_key(text: str) -> str:
    """The manifest with its random key masked (each generation makes a new one)."""
    return KEY_LINE.sub(r"\1KEY", text)


SECRETS = ("s3cr3t-from-job-yaml", "s3cr3t-from-prestart", "s3cr3t-from-the-environment", "s3cr3t-ssh-key-bytes")


def test_no_secret_value_appears_in_any_manifest(tmp_path: Path) -> None:
    """Secrets planted in job.yaml's env, prestart env, the caller's environment and an MPI key never leak."""
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_rsa").write_text(f"-----BEGIN RSA PRIVATE KEY-----\n{SECRETS[3]}\n")
    env = clean_env(WANDB_API_KEY=SECRETS[2], AWS_SECRET_ACCESS_KEY=SECRETS[2])
    for engine in ("pytorch", "tensorflow", "mpi", "ascend"):
        job_file = write_job(
            tmp_path,
            engine,
            env={"WANDB_API_KEY": SECRETS[0], "HF_TOKEN": SECRETS[0]},
            prestart={"env": {"PIP_INDEX_URL": f"https://user:{SECRETS[1]}@pypi.example.com/simple"}},
            mpi={"keys_dir": "keys"},
            kubernetes={"env_from_secrets": ["wandb"]},
            high_availability={"taskd": True, "dp": 4} if engine != "tensorflow" else {},
        )
        for target, engines in TARGETS.items():
            if engine not in engines:
                continue
            result = run_mlaunch(["manifest", "-t", target, str(job_file)], env=env, timeout=60)
            assert result.returncode == 0, result.stderr
            for secret in SECRETS:
                assert secret not in result.stdout, (target, engine, secret)
            assert "WANDB_API_KEY" not in result.stdout and "PRIVATE KEY" not in result.stdout
            assert "secretRef:\n" in result.stdout  # referenced by name instead


def test_every_pair_is_covered() -> None:
    """The validation matrix above covers every target with every engine it accepts."""
    assert {t for t, _ in PAIRS} == set(TARGETS) and len(PAIRS) == 10
    assert isinstance(load_job(EXAMPLES / "pytorch.yaml"), Job)
