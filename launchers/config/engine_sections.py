"""The engine sections of job.yaml: ``pytorch:``, ``tensorflow:``, ``ascend:``, ``mpi:``.

Each engine owns its section; the schema printed by ``mlaunch schema`` is generated from these classes.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from launchers.config.fields import CommandScalar, Count, Duration, PathText, Port, Section, to_str
from launchers.config.limits import MAX_NODES
from launchers.config.secrets import looks_secret


class PytorchOptions(Section):
    """``pytorch:`` — how each process learns its place in the job."""

    style: Literal["env", "init_method", "torchrun"] = Field(
        "env",
        description="env: torchrun's env contract per process; init_method: also append "
        "--init_method tcp://MASTER:PORT --rank R --world_size W (ModelArts-style DDP scripts); "
        "torchrun: one `torchrun` per node with c10d rendezvous (elastic).",
    )
    master_port: Port | None = Field(
        None, description="rendezvous port; default: platform's, else 29500 (free port when simulated)"
    )
    nnodes: str | None = Field(
        None,
        description="elastic node range 'MIN:MAX', e.g. '2:3': the job goes on with at least MIN nodes when one is "
        "lost and takes nodes back up to MAX (elastic:; torchrun style: torchrun's agent runs it); torchrun style "
        "also takes a node count",
    )
    rdzv_backend: str = "c10d"
    rdzv_id: str | None = None
    max_restarts: Count | None = Field(None, description="torchrun style: torchrun's own --max-restarts")

    @field_validator("nnodes", mode="before")
    @classmethod
    def _nnodes(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, str, type(None))):
            raise ValueError("expected a node count like '2' or an elastic range like '2:3'")
        value = to_str(value)
        if value is None:
            return value
        match = re.fullmatch(r"([0-9]{1,6})(?::([0-9]{1,6}))?", value)
        if not match:  # no spaces either: ' 2' would reach torchrun's --nnodes as it is
            raise ValueError("expected a node count like '2' or an elastic range like '2:3' (digits only, no spaces)")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if not 1 <= low <= high <= MAX_NODES:
            raise ValueError(f"expected MIN:MAX with 1 ≤ MIN ≤ MAX ≤ {MAX_NODES} (or a count ≥ 1)")
        return value


class TensorflowOptions(Section):
    """``tensorflow:`` — ps/worker placement (owned by the TensorFlow engine)."""

    ps: int = Field(
        1, ge=0, le=64, description="parameter servers per node (0..64), each beside a worker as on ModelArts"
    )
    output: Literal["flags", "tf_config", "both"] = Field(
        "both",
        description="flags: --ps_hosts/--worker_hosts/--job_name/--task_index; tf_config: TF_CONFIG env",
    )
    chief: bool = Field(False, description="make worker 0 of node 0 a separate 'chief' task in TF_CONFIG")
    port: Port = Field(2222, description="first port of the ps/worker servers")
    decides: Literal["auto", "chief", "workers"] = Field(
        "auto",
        description="whose exit decides success (the others are stopped afterwards): auto = the chief when "
        "there is one (ParameterServerStrategy), else the workers",
    )
    role_flag: Literal["auto", "job_name", "task_name"] = Field(
        "auto",
        description="flag that carries the role: auto = the one the platform used (--task_name or --job_name), "
        "else --job_name",
    )

    @model_validator(mode="after")
    def _chief_needs_tf_config(self) -> TensorflowOptions:
        if self.chief and self.output == "flags":
            raise ValueError(
                "chief: true needs TF_CONFIG (the classic --ps_hosts/--worker_hosts flags have no chief); "
                "set output: tf_config or both"
            )
        return self


class AscendOptions(Section):
    """``ascend:`` — rank-table or MindSpore dynamic-cluster (msrun) launch (owned by the Ascend engine)."""

    style: Literal["rank_table", "msrun"] = Field(
        "rank_table",
        description="rank_table: one process per device from RANK_TABLE_FILE; msrun: MindSpore dynamic cluster "
        "(a MS_SCHED scheduler on node 0 plus MS_WORKER processes). MA_RUN_METHOD=msrun or MindCluster's MS_* "
        "env select msrun when this key is not set",
    )
    rank_table: PathText | None = Field(None, description="path of the rank table; default: $RANK_TABLE_FILE")
    wait_timeout: Duration = Field(600.0, description="how long to wait while the rank table says 'initializing'")
    sched_port: Port = Field(8118, description="msrun: MS_SCHED_PORT (a free port when simulated, unless set)")
    workdir: Literal["rank", "code"] = Field(
        "rank",
        description="each process's working directory: rank = its own log_dir/rank_<R> (as davincirun and the "
        "MindSpore scripts do, so compiler caches do not collide); code = code_dir",
    )
    device_id: Literal["auto", "physical", "logical"] = Field(
        "auto",
        description="what DEVICE_ID carries: physical = the rank table's device_id; logical = the local index "
        "(like ASCEND_DEVICE_ID); auto = logical when ASCEND_RT_VISIBLE_DEVICES remaps devices, else physical",
    )


class MpiOptions(Section):
    """``mpi:`` — sshd bootstrap and mpirun (owned by the MPI engine)."""

    flavour: Literal["openmpi", "horovod", "mindspore-gpu"] = "openmpi"
    sshd_port: Port = 36666
    interfaces: list[str] = Field(default_factory=list, description="NICs for btl/oob_tcp_if_include")
    keys_dir: PathText | None = Field(
        None, description="job secret directory made by `mlaunch keys DIR` (else $MLAUNCH_SSH_KEYS)"
    )
    hosts: list[str] = Field(default_factory=list, description="hosts when the platform names none")
    peer_timeout: Duration = Field(300.0, description="one deadline for every peer's sshd to accept the job key")
    extra_args: list[CommandScalar] = Field(default_factory=list, description="more mpirun options, before the program")
    export: list[str] = Field(
        default_factory=list, description="extra env names (or globs such as MA_*) passed to every rank; no secrets"
    )
    completion_port: Port | None = Field(
        None,
        description="port of the job's control plane on node 0 (it tells the peer nodes the exit code, and notices "
        "a lost node); default sshd_port + 1; control.port wins when set",
    )
    node0_timeout: Duration | None = Field(
        None,
        description="the older name of monitor.node_timeout for MPI jobs (used when monitor.node_timeout is not set): "
        "peer nodes exit non-zero after this long without word from node 0",
    )

    @field_validator("node0_timeout", mode="before")
    @classmethod
    def _node0_timeout_given(cls, value: Any) -> Any:
        if value is None:  # written out, null means nothing: the key is either a duration or left out
            raise ValueError(
                "null is not a duration; give one such as 30s, or leave the key out (it is the MPI engine's older "
                "name of monitor.node_timeout)"
            )
        return value

    @field_validator("export")
    @classmethod
    def _export_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_*?\[\]][A-Za-z0-9_*?\[\]!-]*", name):
                raise ValueError(f"{name!r} is not an environment variable name or glob (e.g. NCCL_DEBUG, MA_*)")
        secrets = [name for name in value if not any(c in name for c in "*?[") and looks_secret(name)]
        if secrets:
            raise ValueError(
                f"{', '.join(secrets)} looks like a credential; mlaunch never passes credentials to mpirun's ranks "
                "(globs skip such names too)"
            )
        return value
