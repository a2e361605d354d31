"""The field types every job.yaml section shares: strict sections, scalars, durations, ports, env names."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from launchers.config.durations import DURATION_PATTERN, parse_duration

ENGINES = ("ascend", "pytorch", "tensorflow", "mpi")
EngineName = Literal["ascend", "pytorch", "tensorflow", "mpi"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def to_str(value: Any) -> Any:
    """YAML turns ``5`` and ``true`` into numbers/bools; argv and env want strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _duration(value: Any) -> float:
    return parse_duration(value)


Scalar = Annotated[str, BeforeValidator(to_str)]
Duration = Annotated[
    float,
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
            "description": "seconds, or a duration such as 30s, 5m, 1h30m",
        }
    ),
]
Port = Annotated[int, Field(ge=1, le=65535)]


class Section(BaseModel):
    """Every section rejects unknown keys: a typo must not silently become a default."""

    model_config = ConfigDict(extra="forbid", frozen=False)


def check_env_names(env: dict[str, str]) -> dict[str, str]:
    """``env`` itself, once every name is a valid environment variable name; else ValueError."""
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name (letters, digits, _)")
    return env
