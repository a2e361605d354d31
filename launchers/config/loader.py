"""Loading job.yaml: YAML → ``Job``, every mistake a ``JobFileError`` naming file, line and key.

Why a custom error path: pydantic's own messages name a key path but not the file or the
line, and a misspelt key deserves a "did you mean". ``parse_job`` composes the YAML node tree
once, validates the plain data, and on failure maps each error's key path back to the node
that caused it. A user mistake becomes a ``JobFileError`` (exit 2, no traceback).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from launchers.config.limits import MAX_JOB_FILE_BYTES, MAX_YAML_DEPTH
from launchers.config.model import Job
from launchers.config.textfile import read_text
from launchers.config.yaml_strict import StrictYAMLError, load_strict
from launchers.errors import JobFileError


def load_job(path: str | Path) -> Job:
    """Read and validate job.yaml; every user mistake raises ``JobFileError`` naming file and line."""
    source = Path(path)
    text = read_text(
        source,
        "job file",
        JobFileError,
        f"{source} is a directory; give the path of a job.yaml file",
        max_bytes=MAX_JOB_FILE_BYTES,
    )
    return parse_job(text, source)


def parse_job(text: str, source: Path) -> Job:
    """Validate job.yaml text; ``source`` names the file in messages and anchors relative paths.

    The text is parsed once by the strict loader (``config/yaml_strict.py``): YAML 1.2 core
    values, no duplicate keys, bounded depth, size and numbers.
    """
    if len(text) > MAX_JOB_FILE_BYTES:
        raise JobFileError(f"{source} is larger than {MAX_JOB_FILE_BYTES:,} bytes; a job file is a few lines")
    try:
        data, node = load_strict(text)
    except StrictYAMLError as exc:
        mark = exc.problem_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise JobFileError(f"{source}{where}: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if "maximum nesting depth" in problem:  # PyYAML ≥ 6.0.4's own parser limit, met before ours
            raise JobFileError(f"{source}{where}: nested more than {MAX_YAML_DEPTH} levels deep") from None
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


def key_error(job: Job, loc: list[str | int], problem: str) -> JobFileError:
    """A mistake found after loading (one that needs the engine): file, line and key named like the others.

    The file is read again for the line: only on this error path, so loading stays one parse.
    """
    line = None
    if job.source is not None:
        try:
            _, root = load_strict(job.source.read_text(encoding="utf-8"))
            line = _line_of(root, loc)
        except (OSError, ValueError, yaml.YAMLError):
            line = None
    where = f"{job.source or 'job.yaml'}" + (f", line {line}" if line else "")
    return JobFileError(f"{where}: key '{_format_loc(loc)}': {problem}")


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
            got_text = " got null" if got is None else got_text  # YAML's word for it, not Python's
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
