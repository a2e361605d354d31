"""The ``kubernetes:`` section of job.yaml and its volumes (read by ``mlaunch manifest``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from launchers.config.fields import Duration, Scalar, Section
from launchers.config.limits import MAX_PROCS_PER_NODE


class VolumeOptions(Section):
    """A volume for the pods: an existing PVC or a host path (neither: nothing is mounted)."""

    pvc: str | None = Field(None, description="name of an existing PersistentVolumeClaim")
    host_path: str | None = Field(None, description="directory on the node (hostPath)")
    mount_path: str | None = Field(None, description="where it appears in the container (default per volume)")
    sub_path: str | None = Field(None, description="mount only this sub-directory of the volume")
    read_only: bool = False

    @field_validator("host_path")
    @classmethod
    def _one_source(cls, value: str | None, info: Any) -> str | None:
        if value is not None and info.data.get("pvc") is not None:
            raise ValueError("give either pvc or host_path, not both")
        if value is not None and not value.startswith("/"):
            raise ValueError("host_path must be an absolute path on the node, e.g. /data/code")
        return value

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("mount_path must be an absolute path in the container, e.g. /job/output")
        return value

    @property
    def given(self) -> bool:
        return self.pvc is not None or self.host_path is not None


class KubernetesOptions(Section):
    """``kubernetes:`` — what manifests need beyond the job itself (owned by the manifest work).

    Nothing secret belongs here: values are written into the manifest as they are. Secrets
    are referenced by name (``env_from_secrets``), never copied.
    """

    image: str | None = Field(None, description="container image (required by `mlaunch manifest`)")
    namespace: str = "default"
    cpu: Scalar | None = Field(None, description="CPU request = limit per pod, e.g. 8 or 7500m")
    memory: str | None = Field(None, description="memory request = limit per pod, e.g. 64Gi")
    accelerator: str | None = Field(None, description="resource name, e.g. nvidia.com/gpu or huawei.com/Ascend910")
    accelerator_count: int | None = Field(
        None, ge=1, le=MAX_PROCS_PER_NODE, description="accelerators per pod; default procs_per_node"
    )
    shm_size: str = Field("16Gi", description="size of the memory-backed /dev/shm (data loaders, staged checkpoints)")
    queue: str = Field("default", description="Volcano queue (also the Kubeflow/MindCluster scheduling queue)")
    node_selector: dict[str, str] = Field(default_factory=dict, description="e.g. {accelerator-type: module-910b-8}")
    code: VolumeOptions = Field(
        default_factory=lambda: VolumeOptions(), description="code volume; none: the code is in the image"
    )
    code_mount: str = Field("/job/code", description="where code_dir is in the container (the working directory)")
    output: VolumeOptions = Field(
        default_factory=lambda: VolumeOptions(),
        description="output/checkpoint volume, mounted at the checkpoint directory unless mount_path is set",
    )
    job_file: str | None = Field(None, description="path of this job.yaml in the container; default: under code_mount")
    entrypoint: str | None = Field(
        None,
        description="generated entrypoint script (mlaunch entrypoint), relative to this file; "
        "default: the container runs `mlaunch --engine E job.yaml`",
    )
    env_from_secrets: list[str] = Field(
        default_factory=list, description="Secrets whose keys become env in every container (envFrom)"
    )
    image_pull_secrets: list[str] = Field(default_factory=list)
    ssh_secret: str | None = Field(
        None,
        description="MPI: Secret made from `mlaunch keys DIR` (kubectl create secret generic NAME --from-file=DIR), "
        "mounted at mpi.keys_dir or /etc/mlaunch/ssh; default <name>-mlaunch-ssh",
    )
    termination_margin: Duration = Field(
        15.0, description="added to checkpoint.grace_period for terminationGracePeriodSeconds"
    )
    ring_controller: str = Field("ascend-910b", description="AscendJob: ring-controller.atlas label")
    fault_scheduling: Literal["grace", "force", "off"] = Field("force", description="AscendJob: fault-scheduling")
    pod_rescheduling: bool = Field(True, description="AscendJob: pod-rescheduling label")

    @field_validator("code_mount")
    @classmethod
    def _code_mount_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("code_mount must be an absolute path in the container, e.g. /job/code")
        return value.rstrip("/") or "/"
