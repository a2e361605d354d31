"""The whole job.yaml as one model: ``Job``, its sections, the paths it resolves, its JSON Schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator

from launchers.config.elastic import ElasticOptions
from launchers.config.engine_sections import AscendOptions, MpiOptions, PytorchOptions, TensorflowOptions
from launchers.config.fields import (
    CommandScalar,
    CommandText,
    EngineName,
    EnvValue,
    PathText,
    Section,
    check_env_names,
)
from launchers.config.health import HealthCheckOptions
from launchers.config.high_availability import HighAvailabilityOptions
from launchers.config.kubernetes import KubernetesOptions
from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE, MAX_WORLD_SIZE
from launchers.config.metrics import MetricsOptions
from launchers.config.monitor import ControlOptions, MonitorOptions
from launchers.config.sections import CheckpointOptions, PrestartOptions, RestartOptions
from launchers.config.slurm import SlurmOptions


class Job(Section):
    """The whole job.yaml."""

    name: CommandText | None = Field(None, description="job name; default: the file's directory name")
    engine: EngineName | None = Field(None, description="default engine; --engine on the command line wins")
    entry: PathText = Field(
        ..., description="the start file (relative to code_dir): .py runs with python, .sh with bash"
    )
    args: list[CommandScalar] = Field(default_factory=list, description="arguments given to the start file")
    code_dir: PathText = Field(".", description="code directory, relative to this file")
    python: PathText | None = Field(
        None, description="interpreter for .py start files; default: the one running mlaunch"
    )
    nodes: int = Field(
        1, ge=1, le=MAX_NODES, description="nodes (simulated on one machine when no platform is detected); 1..65536"
    )
    procs_per_node: int = Field(
        1, ge=1, le=MAX_PROCS_PER_NODE, description="processes (devices) per node; 1..1024, nodes × this ≤ 65536"
    )
    env: dict[str, EnvValue] = Field(default_factory=dict, description="extra environment for every process")
    log_dir: PathText = Field("output/logs", description="per-rank log files, relative to this file")
    preload: list[CommandText] = Field(default_factory=list, description="modules warm standby workers import ahead")
    preload_learning: bool = Field(
        True,
        description="with restarts: warm standbys also preload the installed modules the ranks were seen to "
        "import beyond preload: (never the job's own code); false: only the list",
    )
    preload_fork: bool = Field(
        True,
        description="fork warm standbys from one warm parent per node that imported preload: once "
        "(falls back by itself where forking is unsafe); false: each standby imports the list itself",
    )
    preload_device: bool = Field(
        True,
        description="each warm standby initialises CUDA on the device its slot's rank will use (LOCAL_RANK) before "
        "it is needed, so a replacement skips CUDA's start; an idle standby holds one CUDA context on its GPU; "
        "false: standbys never touch a device",
    )
    prestart: PrestartOptions = Field(default_factory=lambda: PrestartOptions())
    checkpoint: CheckpointOptions = Field(default_factory=lambda: CheckpointOptions())
    restart: RestartOptions = Field(default_factory=lambda: RestartOptions())
    pytorch: PytorchOptions = Field(default_factory=lambda: PytorchOptions())
    tensorflow: TensorflowOptions = Field(default_factory=lambda: TensorflowOptions())
    ascend: AscendOptions = Field(default_factory=lambda: AscendOptions())
    mpi: MpiOptions = Field(default_factory=lambda: MpiOptions())
    high_availability: HighAvailabilityOptions = Field(default_factory=lambda: HighAvailabilityOptions())
    kubernetes: KubernetesOptions = Field(default_factory=lambda: KubernetesOptions())
    slurm: SlurmOptions = Field(default_factory=lambda: SlurmOptions())
    monitor: MonitorOptions = Field(default_factory=lambda: MonitorOptions())
    control: ControlOptions = Field(default_factory=lambda: ControlOptions())
    health_check: HealthCheckOptions = Field(default_factory=lambda: HealthCheckOptions())
    elastic: ElasticOptions = Field(default_factory=lambda: ElasticOptions())
    metrics: MetricsOptions = Field(default_factory=lambda: MetricsOptions())

    _source: Path | None = PrivateAttr(None)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return check_env_names(value)

    @field_validator("procs_per_node")
    @classmethod
    def _world_size(cls, value: int, info: ValidationInfo) -> int:
        nodes = info.data.get("nodes")
        if isinstance(nodes, int) and nodes * value > MAX_WORLD_SIZE:
            raise ValueError(
                f"nodes × procs_per_node = {nodes} × {value} = {nodes * value} ranks; "
                f"at most {MAX_WORLD_SIZE} ranks in total"
            )
        return value

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


def job_json_schema() -> dict[str, Any]:
    """JSON Schema of job.yaml for editors (``mlaunch schema``)."""
    schema = Job.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "mlaunch job.yaml"
    return schema
