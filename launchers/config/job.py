"""job.yaml: the one file a user writes, loaded with PyYAML and validated with pydantic.

This is the import point for the job model: ``Job``, ``load_job``, ``parse_job``,
``job_json_schema`` and every section class. Where each lives:

- ``config/fields.py`` — the field types every section shares (durations, ports, env names);
- ``config/engine_sections.py`` — ``pytorch:``, ``tensorflow:``, ``ascend:``, ``mpi:``;
- ``config/sections.py`` — ``prestart:``, ``checkpoint:``, ``restart:``;
- ``config/high_availability.py``, ``config/kubernetes.py`` — those sections;
- ``config/model.py`` — the top-level ``Job`` and the JSON Schema ``mlaunch schema`` prints;
- ``config/loader.py`` — YAML → ``Job``, errors naming file, line and key, "did you mean".
"""

from __future__ import annotations

from launchers.config.engine_sections import AscendOptions, MpiOptions, PytorchOptions, TensorflowOptions
from launchers.config.fields import ENGINES, Duration, EngineName, Port, Scalar, Section
from launchers.config.high_availability import HighAvailabilityOptions, RecoverStrategy
from launchers.config.kubernetes import KubernetesOptions, VolumeOptions
from launchers.config.loader import format_validation_error, load_job, parse_job
from launchers.config.model import Job, job_json_schema
from launchers.config.sections import CheckpointOptions, PrestartOptions, RestartOptions

__all__ = [
    "ENGINES",
    "AscendOptions",
    "CheckpointOptions",
    "Duration",
    "EngineName",
    "HighAvailabilityOptions",
    "Job",
    "KubernetesOptions",
    "MpiOptions",
    "Port",
    "PrestartOptions",
    "PytorchOptions",
    "RecoverStrategy",
    "RestartOptions",
    "Scalar",
    "Section",
    "TensorflowOptions",
    "VolumeOptions",
    "format_validation_error",
    "job_json_schema",
    "load_job",
    "parse_job",
]
