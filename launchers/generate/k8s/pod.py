"""The pod every manifest target shares: container, command, volumes, resources, grace, names.

Each target module (``volcano``, ``pytorchjob``, ``tfjob``, ``mpijob``, ``ascendjob``) wraps one or
more of these pod templates in its operator's job kind. What is here is the contract between the
manifest and mlaunch inside the pod:

- the container runs ``mlaunch --engine E <job.yaml>`` (or the generated entrypoint), with
  code_dir at ``kubernetes.code_mount`` as its working directory, so every path in job.yaml
  resolves in the container as it does on the user's machine;
- ``terminationGracePeriodSeconds`` = ``checkpoint.grace_period`` + ``kubernetes.termination_margin``
  (``launchers.config.timers``), so the kubelet's SIGKILL never comes before mlaunch's own SIGKILL
  at the end of the grace period (the workers' dying checkpoint fits in between);
- ``/dev/shm`` is a memory-backed ``emptyDir`` of ``shm_size`` (data loaders, staged checkpoints);
- nothing from job.yaml's ``env`` or the caller's environment is copied: mlaunch applies
  job.yaml's env inside the pod, and secrets are referenced by name (``envFrom``) only.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from launchers.config.job import Job, VolumeOptions
from launchers.config.timers import timer_chain
from launchers.errors import UserError
from launchers.generate.k8s.metrics import metrics_exposure

MANAGED_BY = {"app.kubernetes.io/managed-by": "mlaunch"}
SHM_MOUNT = "/dev/shm"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def where(job: Job) -> str:
    """``<job.yaml>: `` to start a message about one of its settings."""
    return f"{job.source}: " if job.source else ""


# ----------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------


def k8s_name(job: Job, longest_suffix: str) -> str:
    """The job's name as a Kubernetes object name; pod/service names ``<name><suffix>`` must stay ≤ 63."""
    name = job.job_name
    budget = 63 - len(longest_suffix)
    if not DNS_LABEL.match(name) or len(name) > budget:
        raise UserError(
            f"{where(job)}job name {name!r} cannot name Kubernetes objects: expected lowercase letters, digits "
            f"and '-', starting with a letter, at most {budget} characters (pods are named {name}{longest_suffix}); "
            "set `name:` in job.yaml"
        )
    return name


def check_namespace(job: Job) -> str:
    namespace = job.kubernetes.namespace
    if not NAMESPACE.match(namespace) or len(namespace) > 63:
        raise UserError(f"{where(job)}kubernetes.namespace {namespace!r} is not a valid namespace name")
    return namespace


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, **MANAGED_BY}


# ----------------------------------------------------------------------------------------
# Paths: where job.yaml's files are in the container
# ----------------------------------------------------------------------------------------


@dataclass
class ContainerPaths:
    """Maps paths on this machine (resolved from job.yaml) to their place in the container."""

    job: Job
    code_mount: str

    def path(self, local: Path) -> str:
        """Under code_dir → under code_mount; an absolute path elsewhere stays as it is."""
        code = self.job.code_path
        try:
            rel = local.resolve().relative_to(code)
        except ValueError:
            return str(PurePosixPath(local))
        return posixpath.normpath(posixpath.join(self.code_mount, rel.as_posix()))

    def setting(self, key: str, value: str) -> str:
        """A job.yaml path setting in the container; a relative one must stay inside code_dir."""
        local = self.job.resolve(value)
        if not Path(value).expanduser().is_absolute():
            try:
                local.relative_to(self.job.code_path)
            except ValueError:
                raise UserError(
                    f"{where(self.job)}{key}: {value} is outside code_dir ({self.job.code_path}); the pods see only "
                    f"code_dir (at {self.code_mount}): use a path inside code_dir, or an absolute path that exists in "
                    "the pods (kubernetes.output can mount a volume there)"
                ) from None
        return self.path(local)

    @property
    def job_file(self) -> str:
        given = self.job.kubernetes.job_file
        if given:
            if not given.startswith("/"):
                raise UserError(f"{where(self.job)}kubernetes.job_file must be an absolute path in the container")
            return given
        source = self.job.source
        if source is None:
            raise UserError("the job has no job.yaml file; set kubernetes.job_file")
        try:
            source.resolve().relative_to(self.job.code_path)
        except ValueError:
            raise UserError(
                f"{source} is not inside code_dir ({self.job.code_path}), so the pods cannot find it on the code "
                "volume; move job.yaml into code_dir, or set kubernetes.job_file to its path in the container "
                "(paths in job.yaml are relative to its own directory there too)"
            ) from None
        return self.path(source)

    @property
    def workdir(self) -> str:
        return self.code_mount

    @property
    def checkpoint_dir(self) -> str:
        return self.setting("checkpoint.dir", self.job.checkpoint.dir)


# ----------------------------------------------------------------------------------------
# Pieces of the pod
# ----------------------------------------------------------------------------------------


def command(job: Job, engine: str, paths: ContainerPaths) -> list[str]:
    """The container's command: the generated entrypoint when job.yaml names one, else mlaunch itself."""
    entrypoint = job.kubernetes.entrypoint
    if entrypoint:
        return ["bash", paths.setting("kubernetes.entrypoint", entrypoint)]
    return ["mlaunch", "--engine", engine, paths.job_file]


def _quantity(job: Job, key: str, value: str) -> str:
    if not QUANTITY.match(value):
        raise UserError(
            f"{where(job)}kubernetes.{key}: {value!r} is not a Kubernetes quantity; expected e.g. 8, 7500m, 64Gi"
        )
    return value


def resources(job: Job, *, accelerators: bool = True) -> dict[str, Any]:
    """requests = limits (extended resources such as GPUs/NPUs must have them equal)."""
    k8s = job.kubernetes
    amounts: dict[str, Any] = {}
    if k8s.cpu is not None:
        amounts["cpu"] = _quantity(job, "cpu", str(k8s.cpu))
    if k8s.memory is not None:
        amounts["memory"] = _quantity(job, "memory", k8s.memory)
    if accelerators and k8s.accelerator:
        if not RESOURCE_NAME.match(k8s.accelerator):
            raise UserError(
                f"{where(job)}kubernetes.accelerator: {k8s.accelerator!r} is not a resource name; expected e.g. "
                "nvidia.com/gpu or huawei.com/Ascend910"
            )
        amounts[k8s.accelerator] = k8s.accelerator_count or job.procs_per_node
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


@dataclass
class Mounts:
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self, name: str, source: dict[str, Any], path: str, *, sub_path: str | None = None, read_only: bool = False
    ) -> None:
        self.volumes.append({"name": name, **source})
        mount: dict[str, Any] = {"name": name, "mountPath": path}
        if sub_path:
            mount["subPath"] = sub_path
        if read_only:
            mount["readOnly"] = True
        self.mounts.append(mount)

    def add_volume(self, name: str, volume: VolumeOptions, path: str, *, create: bool) -> None:
        """A PVC, or a hostPath that must exist (code) or is created when missing (output), at ``path``."""
        if volume.pvc is not None:
            source: dict[str, Any] = {"persistentVolumeClaim": {"claimName": volume.pvc}}
        else:
            source = {"hostPath": {"path": volume.host_path, "type": "DirectoryOrCreate" if create else "Directory"}}
        self.add(name, source, path, sub_path=volume.sub_path, read_only=volume.read_only)


def volumes(job: Job, paths: ContainerPaths) -> Mounts:
    """code (PVC/hostPath), output/checkpoint (PVC/hostPath), and the memory-backed /dev/shm."""
    k8s = job.kubernetes
    found = Mounts()
    if k8s.code.given:
        found.add_volume("code", k8s.code, k8s.code.mount_path or paths.code_mount, create=False)
    if k8s.output.given:
        found.add_volume("output", k8s.output, k8s.output.mount_path or paths.checkpoint_dir, create=True)
    found.add(
        "dshm", {"emptyDir": {"medium": "Memory", "sizeLimit": _quantity(job, "shm_size", k8s.shm_size)}}, SHM_MOUNT
    )
    return found


def downward_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


@dataclass
class ContainerSpec:
    """What differs per target: the container's name, ports, extra env, extra mounts, accelerators."""

    name: str
    ports: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)
    extra: Mounts = field(default_factory=Mounts)
    accelerators: bool = True
    command: list[str] | None = None


def pod_template(
    job: Job,
    engine: str,
    name: str,
    spec: ContainerSpec,
    *,
    restart_policy: str | None = None,
    template_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A PodTemplateSpec running mlaunch for ``engine``."""
    k8s = job.kubernetes
    if not k8s.image:
        raise UserError(
            f"{where(job)}kubernetes.image is not set; a manifest needs the container image that has mlaunch and "
            "the job's frameworks, e.g. kubernetes: {image: registry.example.com/team/train:1.0}"
        )
    paths = ContainerPaths(job, k8s.code_mount)
    mounts = volumes(job, paths)
    env = [downward_env("POD_IP", "status.podIP"), *spec.env]
    container: dict[str, Any] = {
        "name": spec.name,
        "image": k8s.image,
        "command": spec.command or command(job, engine, paths),
        "workingDir": paths.workdir,
        "env": env,
    }
    if k8s.env_from_secrets:
        container["envFrom"] = [{"secretRef": {"name": secret}} for secret in k8s.env_from_secrets]
    ports, annotations = metrics_exposure(job, spec.ports)
    if ports:
        container["ports"] = ports
    res = resources(job, accelerators=spec.accelerators)
    if res:
        container["resources"] = res
    container["volumeMounts"] = [*mounts.mounts, *spec.extra.mounts]
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": timer_chain(job).termination_grace_period_seconds,
        "containers": [container],
        "volumes": [*mounts.volumes, *spec.extra.volumes],
    }
    if restart_policy:
        pod_spec["restartPolicy"] = restart_policy
    if k8s.node_selector:
        pod_spec["nodeSelector"] = dict(k8s.node_selector)
    if k8s.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in k8s.image_pull_secrets]
    metadata: dict[str, Any] = {"labels": {**labels(name), **(template_labels or {})}}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}
