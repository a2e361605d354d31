"""job.yaml: the one file a user writes, loaded with PyYAML and validated with pydantic.

Why a custom error path: pydantic's own messages name a key path but not the file or the
line, and a misspelt key deserves a "did you mean". ``load_job`` composes the YAML node tree
once, validates the plain data, and on failure maps each error's key path back to the node
that caused it. A user mistake becomes a ``JobFileError`` (exit 2, no traceback).

Each engine owns its own section class below (``pytorch:``, ``tensorflow:``, ``ascend:``,
``mpi:``); the schema printed by ``mlaunch schema`` is generated from these classes.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from launchers.config.durations import parse_duration
from launchers.config.secrets import looks_secret
from launchers.errors import JobFileError

ENGINES = ("ascend", "pytorch", "tensorflow", "mpi")
EngineName = Literal["ascend", "pytorch", "tensorflow", "mpi"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _to_str(value: Any) -> Any:
    """YAML turns ``5`` and ``true`` into numbers/bools; argv and env want strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _duration(value: Any) -> float:
    return parse_duration(value)


Scalar = Annotated[str, BeforeValidator(_to_str)]
Duration = Annotated[
    float,
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": r"^[0-9.]+(ms|s|m|h|d)?"},
            ],
            "description": "seconds, or a duration such as 30s, 5m, 1h30m",
        }
    ),
]
Port = Annotated[int, Field(ge=1, le=65535)]


class Section(BaseModel):
    """Every section rejects unknown keys: a typo must not silently become a default."""

    model_config = ConfigDict(extra="forbid", frozen=False)


def _check_env_names(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name (letters, digits, _)")
    return env


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
    nnodes: str | None = Field(None, description="torchrun style: node count or elastic range, e.g. '2:3'")
    rdzv_backend: str = "c10d"
    rdzv_id: str | None = None
    max_restarts: int | None = Field(None, ge=0, description="torchrun style: torchrun's own --max-restarts")

    @field_validator("nnodes", mode="before")
    @classmethod
    def _nnodes(cls, value: Any) -> Any:
        value = _to_str(value)
        if value is not None and not re.fullmatch(r"\d+(:\d+)?", str(value)):
            raise ValueError("expected a node count like '2' or an elastic range like '2:3'")
        return value


class TensorflowOptions(Section):
    """``tensorflow:`` — ps/worker layout (owned by the TensorFlow engine)."""

    ps: int = Field(1, ge=0, description="parameter servers per node, each beside a worker as on ModelArts")
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
    rank_table: str | None = Field(None, description="path of the rank table; default: $RANK_TABLE_FILE")
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
    keys_dir: str | None = Field(
        None, description="job secret directory made by `mlaunch keys DIR` (else $MLAUNCH_SSH_KEYS)"
    )
    hosts: list[str] = Field(default_factory=list, description="hosts when the platform names none")
    peer_timeout: Duration = Field(300.0, description="one deadline for every peer's sshd to accept the job key")
    extra_args: list[Scalar] = Field(default_factory=list, description="more mpirun options, before the program")
    export: list[str] = Field(
        default_factory=list, description="extra env names (or globs such as MA_*) passed to every rank; no secrets"
    )
    completion_port: Port | None = Field(
        None, description="port on which peer nodes wait for node 0's exit code; default sshd_port + 1"
    )
    node0_timeout: Duration = Field(
        60.0, description="peer nodes exit non-zero after this long without word from node 0"
    )

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


class PrestartOptions(Section):
    """``prestart:`` — what the generated ma_pre_start.sh installs and exports."""

    dir: str | None = Field(
        None,
        description="directory the pre-start enters and installs from; relative to code_dir, or absolute "
        "(e.g. /home/ma-user/modelarts/inputs/data_url_0); default: code_dir",
    )
    wheels: list[str] = Field(
        default_factory=list,
        description="wheel files or globs (e.g. dist/mlaunch-*.whl), relative to prestart.dir; installed in order",
    )
    requirements: str | None = Field(None, description="requirements file for pip install -r, relative to prestart.dir")
    commands: list[str] = Field(
        default_factory=list, description="extra shell commands, run after the installs (each by bash -c)"
    )
    env: dict[str, Scalar] = Field(
        default_factory=dict, description="exported, and persisted for the start file; no secrets here"
    )
    passthrough: list[str] = Field(
        default_factory=list,
        description="env names (secrets: *_KEY, *TOKEN*...) passed on from the platform env, never written or echoed",
    )
    cleanup: bool = Field(False, description="remove the wheel files it installed from prestart.dir afterwards")
    offline: bool = Field(False, description="pip --no-index: install only from the wheels and find_links")
    find_links: list[str] = Field(
        default_factory=list, description="directories of wheels for pip --find-links, relative to prestart.dir"
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        _check_env_names(value)
        secrets = [name for name in value if looks_secret(name)]
        if secrets:
            raise ValueError(
                f"{', '.join(secrets)} looks like a secret; mlaunch never writes secrets into generated scripts. "
                "Set it in the platform's job environment and list its name under prestart.passthrough"
            )
        return value

    @field_validator("passthrough")
    @classmethod
    def _passthrough_names(cls, value: list[str]) -> list[str]:
        _check_env_names(dict.fromkeys(value, ""))
        return value


class CheckpointOptions(Section):
    """``checkpoint:`` — where dying checkpoints go and how long a save may take."""

    dir: str = "output/ckpt"
    grace_period: Duration = Field(30.0, description="SIGTERM → SIGKILL budget for workers to save and exit")
    keep: int = Field(3, ge=1, description="committed checkpoints to keep")
    step_time: Duration | None = Field(None, description="declared time of one training step (grace budget)")
    save_time: Duration | None = Field(None, description="declared time of one save (grace budget)")


class RestartOptions(Section):
    """``restart:`` — how often a failed group is started again."""

    max_restarts: int = Field(0, ge=0)
    backoff: Duration = Field(1.0, description="wait before the first restart; doubles each time")
    max_backoff: Duration = Field(60.0)


RecoverStrategy = Literal["retry", "recover", "recover-in-place", "elastic-training", "dump", "exit"]


class HighAvailabilityOptions(Section):
    """``high_availability:`` — MindIO TFT / TaskD wiring (owned by the HA work).

    TFT features (``ttp``, ``uce``, ``arf``) set MindIO's env for MindSpore/MindFormers;
    ``taskd`` starts MindCluster's TaskD manager beside node 0's processes. Both need a
    replica relation (``dp / optimizer_shard`` ≥ 2), checked before launch.
    """

    ttp: bool = Field(False, description="TTP: dying checkpoint written by one healthy rank per replica group")
    uce: bool = Field(False, description="UCE: on-chip memory fault repair (implies ttp)")
    arf: bool = Field(False, description="ARF: process-level rescheduling (implies ttp)")
    controller: str | None = Field(
        None, description="HOST:PORT (or HOST) of the TFT controller → MS_TFT_IP/MS_TFT_PORT; default node 0:30051"
    )
    dp: int = Field(1, ge=1, description="data-parallel size (data_parallel)")
    tp: int = Field(1, ge=1, description="tensor/model-parallel size (model_parallel)")
    pp: int = Field(1, ge=1, description="pipeline stages (pipeline_stage)")
    optimizer_shard: int = Field(1, ge=1, description="optimizer_weight_shard_size (1 = optimizer parallel off)")
    sink_size: int = Field(1, ge=1, description="MindSpore data sink size; MindIO TFT works only with 1")
    taskd: bool = Field(False, description="start MindCluster's TaskD manager on node 0 and preload libtaskd.so")
    mindspeed_flags: bool = Field(
        False, description="append --enable-high-availability --enable-hbmfault-repair to the start file's args"
    )
    hccl_op_retry: str = Field("L0:0, L1:1, L2:1", description="HCCL_OP_RETRY_ENABLE when taskd is on")
    recover_strategy: list[RecoverStrategy] | None = Field(
        None,
        description="MindCluster recover-strategy annotation; default from the features: "
        "uce or taskd → retry, arf → recover, ttp → dump",
    )

    @field_validator("controller")
    @classmethod
    def _controller(cls, value: str | None) -> str | None:
        if value is None:
            return value
        match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?", value.strip())
        if not match or (match.group(2) and not 0 < int(match.group(2)) < 65536):
            raise ValueError("expected HOST:PORT or HOST, e.g. 10.0.0.1:30051")
        return value.strip()

    @property
    def enabled(self) -> bool:
        """Whether any high-availability feature is asked for (TFT features or TaskD)."""
        return self.ttp or self.uce or self.arf or self.taskd

    @property
    def tft(self) -> bool:
        """Whether MindIO TFT (TTP/UCE/ARF) is asked for."""
        return self.ttp or self.uce or self.arf


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
    accelerator_count: int | None = Field(None, ge=1, description="accelerators per pod; default procs_per_node")
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


class Job(Section):
    """The whole job.yaml."""

    name: str | None = Field(None, description="job name; default: the file's directory name")
    engine: EngineName | None = Field(None, description="default engine; --engine on the command line wins")
    entry: str = Field(..., description="the start file (relative to code_dir): .py runs with python, .sh with bash")
    args: list[Scalar] = Field(default_factory=list, description="arguments given to the start file")
    code_dir: str = Field(".", description="code directory, relative to this file")
    python: str | None = Field(None, description="interpreter for .py start files; default: the one running mlaunch")
    nodes: int = Field(1, ge=1, description="nodes (simulated on one machine when no platform is detected)")
    procs_per_node: int = Field(1, ge=1, description="processes (devices) per node")
    env: dict[str, Scalar] = Field(default_factory=dict, description="extra environment for every process")
    log_dir: str = Field("output/logs", description="per-rank log files, relative to this file")
    preload: list[str] = Field(default_factory=list, description="modules warm standby workers import ahead")
    prestart: PrestartOptions = Field(default_factory=lambda: PrestartOptions())
    checkpoint: CheckpointOptions = Field(default_factory=lambda: CheckpointOptions())
    restart: RestartOptions = Field(default_factory=lambda: RestartOptions())
    pytorch: PytorchOptions = Field(default_factory=lambda: PytorchOptions())
    tensorflow: TensorflowOptions = Field(default_factory=lambda: TensorflowOptions())
    ascend: AscendOptions = Field(default_factory=lambda: AscendOptions())
    mpi: MpiOptions = Field(default_factory=lambda: MpiOptions())
    high_availability: HighAvailabilityOptions = Field(default_factory=lambda: HighAvailabilityOptions())
    kubernetes: KubernetesOptions = Field(default_factory=lambda: KubernetesOptions())

    _source: Path | None = PrivateAttr(None)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_env_names(value)

    @field_validator("entry")
    @classmethod
    def _entry_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("entry must name the start file, e.g. train.py")
        return value

    # -- paths -------------------------------------------------------------------------
    @property
    def source(self) -> Path | None:
        """The job.yaml this job came from (None when built in code)."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """Directory relative paths in job.yaml are resolved against (the file's own directory)."""
        return self._source.parent if self._source else Path.cwd()

    def resolve(self, path: str) -> Path:
        """Resolve a job.yaml path: absolute stays, relative is taken from the file's directory."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    @property
    def code_path(self) -> Path:
        return self.resolve(self.code_dir)

    @property
    def entry_path(self) -> Path:
        p = Path(self.entry).expanduser()
        return p if p.is_absolute() else (self.code_path / p).resolve()

    @property
    def log_path(self) -> Path:
        return self.resolve(self.log_dir)

    @property
    def job_name(self) -> str:
        if self.name:
            return self.name
        return self.base_dir.name or "job"


# ----------------------------------------------------------------------------------------
# Loading with error locations
# ----------------------------------------------------------------------------------------


def load_job(path: str | Path) -> Job:
    """Read and validate job.yaml; every user mistake raises ``JobFileError`` naming file and line."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobFileError(f"job file {source} does not exist") from None
    except IsADirectoryError:
        raise JobFileError(f"{source} is a directory; give the path of a job.yaml file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobFileError(f"cannot read job file {source}: {exc}") from None
    return parse_job(text, source)


def parse_job(text: str, source: Path) -> Job:
    """Validate job.yaml text; ``source`` names the file in messages and anchors relative paths."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise JobFileError(f"{source}{where}: this is not valid YAML ({problem})") from None
    except yaml.YAMLError as exc:
        raise JobFileError(f"{source}: this is not valid YAML ({exc})") from None
    if data is None:
        raise JobFileError(f"{source} is empty; a job needs at least `entry: train.py`")
    if not isinstance(data, dict):
        raise JobFileError(
            f"{source}, line 1: expected a mapping of keys (entry:, nodes:, ...), got a {type(data).__name__}"
        )
    try:
        job = Job.model_validate(data)
    except ValidationError as exc:
        raise JobFileError(format_validation_error(exc, node, source)) from None
    job._source = source.resolve()
    return job


def format_validation_error(exc: ValidationError, root: yaml.Node | None, source: Path) -> str:
    """One readable paragraph per problem: file, line, key path, what was expected, a hint."""
    lines = []
    errors = exc.errors(include_url=False)
    for err in errors[:10]:
        loc = [part for part in err["loc"] if isinstance(part, (str, int))]
        # dict keys are reported as (..., key, '[key]'); keep the path to the key itself
        line = _line_of(root, loc)
        key_path = _format_loc(loc)
        where = f"{source}, line {line}" if line else str(source)
        kind = err["type"]
        if kind == "extra_forbidden":
            bad_key = str(loc[-1]) if loc else "?"
            allowed = _allowed_keys(loc[:-1])
            hint = ""
            close = difflib.get_close_matches(bad_key, allowed, n=1, cutoff=0.6)
            if close:
                hint = f" Did you mean '{close[0]}'?"
            valid = f" Valid keys here: {', '.join(allowed)}." if allowed else ""
            lines.append(f"{where}: unknown key '{key_path}'.{hint}{valid}")
        elif kind == "missing":
            lines.append(f"{where}: required key '{key_path}' is missing ({_describe(loc)}).")
        else:
            got = err.get("input")
            got_text = f" got {got!r}" if not isinstance(got, (dict, list)) else ""
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            lines.append(f"{where}: key '{key_path}': {msg};{got_text}.".replace(";.", "."))
    if len(errors) > 10:
        lines.append(f"... and {len(errors) - 10} more problems")
    header = f"{source} is not a valid job file:" if len(lines) > 1 else ""
    return "\n".join([header, *("  " + line for line in lines)]) if header else lines[0]


def _format_loc(loc: list[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _line_of(root: yaml.Node | None, loc: list[str | int]) -> int | None:
    """Walk the composed YAML tree along ``loc``; return the 1-based line of the deepest match."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == str(part):
                    line = key_node.start_mark.line + 1
                    node = value_node
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _model_at(loc: list[str | int]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Job
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


def _allowed_keys(loc: list[str | int]) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model else []


def _describe(loc: list[str | int]) -> str:
    model = _model_at(loc[:-1])
    if model and isinstance(loc[-1], str) and loc[-1] in model.model_fields:
        return model.model_fields[loc[-1]].description or "required"
    return "required"


def job_json_schema() -> dict[str, Any]:
    """JSON Schema of job.yaml for editors (``mlaunch schema``)."""
    schema = Job.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "mlaunch job.yaml"
    return schema
