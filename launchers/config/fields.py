"""The field types every job.yaml section shares: strict sections, scalars, durations, ports, env names."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from launchers.config.durations import DURATION_PATTERN, parse_duration
from launchers.config.limits import MAX_COUNT, MAX_DURATION

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
                {"type": "number", "minimum": 0, "maximum": MAX_DURATION},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
            "description": "seconds, or a duration such as 30s, 5m, 1h30m",
        }
    ),
]
Port = Annotated[int, Field(ge=1, le=65535)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # restarts and other plain counts: 0 ≤ n ≤ 1,000,000
PositiveCount = Annotated[int, Field(ge=1, le=MAX_COUNT)]
_BAD_COMMAND_CHARS = re.compile(r"[\x00\n\r]")


def _command_text(value: Any) -> Any:
    """Values that reach a command line hold no NUL: execve refuses it, after the start file ran half-way.

    A line break in an argument is passed on byte for byte (tests/test_injection.py proves it).
    """
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("a NUL character cannot be part of a command line")
    return value


def _path_line(value: Any) -> Any:
    """Paths and the interpreter (``entry``, ``python``, ``code_dir``...) hold no NUL and no line break."""
    if isinstance(value, str):
        bad = _BAD_COMMAND_CHARS.search(value)
        if bad:
            name = {"\x00": "a NUL character", "\n": "a newline", "\r": "a carriage return"}[bad.group()]
            raise ValueError(f"{name} cannot be part of a path or an interpreter name")
    return value


def _no_nul(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("a NUL character cannot be part of an environment value")
    return value


def _path_text(value: str) -> str:
    """A path the OS can take: at most 4096 bytes, each part at most 255 (else ENAMETOOLONG at run time)."""
    if len(value.encode("utf-8", "surrogatepass")) > 4096:
        raise ValueError("a path must be at most 4096 bytes long")
    if any(len(part.encode("utf-8", "surrogatepass")) > 255 for part in value.split("/")):
        raise ValueError("each part of a path must be at most 255 bytes long")
    return value


CommandText = Annotated[str, AfterValidator(_command_text)]  # argv words, interpreter
PathText = Annotated[str, AfterValidator(_path_line), AfterValidator(_path_text)]  # paths in job.yaml
CommandScalar = Annotated[str, BeforeValidator(to_str), AfterValidator(_command_text)]  # args: numbers become words
EnvValue = Annotated[str, BeforeValidator(to_str), AfterValidator(_no_nul)]


class Section(BaseModel):
    """Every section rejects unknown keys (a typo must not silently become a default) and is strict:
    ``true`` is not a count, ``"2"`` is not a number, ``1`` is not ``true`` — unless a field says otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=False, strict=True)


def check_env_names(env: dict[str, str]) -> dict[str, str]:
    """``env`` itself, once every name is a valid environment variable name; else ValueError."""
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a valid environment variable name (letters, digits, _)")
    return env
