"""job.yaml: loading, validation messages (file, line, key, expectation, did-you-mean), schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_mlaunch

from launchers.config.durations import parse_duration
from launchers.config.job import job_json_schema, load_job
from launchers.errors import JobFileError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_minimal_job_gets_defaults(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, "entry: train.py\n"))
    assert job.nodes == 1 and job.procs_per_node == 1
    assert job.checkpoint.grace_period == 30.0
    assert job.restart.max_restarts == 0
    assert job.entry_path == tmp_path / "train.py"
    assert job.job_name == tmp_path.name


def test_values_are_coerced_where_yaml_guesses_types(tmp_path: Path) -> None:
    job = load_job(
        write(
            tmp_path,
            "entry: t.py\nargs: [--epochs, 5, --fast, true]\nenv: {GLOG_v: 2}\n"
            "checkpoint: {grace_period: 2m}\nrestart: {backoff: 500ms}\n",
        )
    )
    assert job.args == ["--epochs", "5", "--fast", "true"]
    assert job.env == {"GLOG_v": "2"}
    assert job.checkpoint.grace_period == 120.0
    assert job.restart.backoff == 0.5


def test_relative_paths_resolve_against_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    job = load_job(write(tmp_path, "entry: train.py\ncode_dir: src\nlog_dir: logs\n"))
    assert job.code_path == tmp_path / "src"
    assert job.entry_path == tmp_path / "src" / "train.py"
    assert job.log_path == tmp_path / "logs"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("entry: t.py\nrestart:\n  max_restart: 2\n", ["line 3", "restart.max_restart", "Did you mean 'max_restarts'"]),
        ("entry: t.py\nnodse: 2\n", ["line 2", "'nodse'", "Did you mean 'nodes'"]),
        ("entry: t.py\nnodes: two\n", ["line 2", "'nodes'", "valid integer", "'two'"]),
        ("entry: t.py\nnodes: 0\n", ["line 2", "'nodes'", "greater than or equal to 1"]),
        ("entry: t.py\nengine: pytorc\n", ["line 2", "'engine'", "'pytorch'"]),
        ("entry: t.py\ncheckpoint:\n  grace_period: soon\n", ["line 3", "checkpoint.grace_period", "30s"]),
        ("args: [a]\n", ["required key 'entry' is missing"]),
        ("entry: t.py\nenv:\n  'BAD-NAME': x\n", ["line 2", "'env'", "not a valid environment variable name"]),
        ("entry: t.py\npytorch: {style: mpirun}\n", ["line 2", "pytorch.style", "'env', 'init_method' or 'torchrun'"]),
        ("entry: t.py\nargs:\n  - ok\n  - [nested]\n", ["line 4", "args[1]"]),
        ("entry: [t.py\n", ["line 2", "not valid YAML"]),
        ("- entry: t.py\n", ["expected a mapping"]),
        ("", ["is empty"]),
    ],
)
def test_bad_job_files_name_file_line_and_key(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(JobFileError) as info:
        load_job(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message, message


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(JobFileError, match="does not exist"):
        load_job(tmp_path / "nope.yaml")


@pytest.mark.parametrize("command", [["run"], ["plan"], ["check"], []])
def test_cli_exits_2_without_traceback_for_a_bad_job(tmp_path: Path, command: list[str]) -> None:
    path = write(tmp_path, "entry: t.py\nengine: pytorch\nrestart: {max_restart: 1}\n")
    result = run_mlaunch([*command, str(path)], timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "line 3" in result.stderr and "Did you mean 'max_restarts'" in result.stderr


def test_missing_start_file_refuses_to_launch(tmp_path: Path) -> None:
    path = write(tmp_path, "entry: missing.py\nengine: pytorch\n")
    result = run_mlaunch([str(path)], timeout=60)
    assert result.returncode == 2
    assert "missing.py does not exist" in result.stderr
    assert not (tmp_path / "output" / "logs").exists()  # nothing was started


def test_engine_must_come_from_somewhere(tmp_path: Path) -> None:
    path = write(tmp_path, "entry: t.py\n")
    result = run_mlaunch(["plan", str(path)], timeout=60)
    assert result.returncode == 2
    assert "no engine given" in result.stderr


def test_unknown_engine_flag(tmp_path: Path) -> None:
    path = write(tmp_path, "entry: t.py\n")
    result = run_mlaunch(["plan", "--engine", "jax", str(path)], timeout=60)
    assert result.returncode == 2
    assert "unknown engine 'jax'" in result.stderr


def test_schema_is_json_schema_of_the_job() -> None:
    result = run_mlaunch(["schema"], timeout=60)
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["required"] == ["entry"]
    assert {"nodes", "procs_per_node", "checkpoint", "restart", "pytorch"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_schema_validates_the_examples() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schema = json.loads(run_mlaunch(["schema"], timeout=60).stdout)
    from conftest import EXAMPLES

    for path in EXAMPLES.glob("*/job.yaml"):
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("30s", True),
        ("1m30s", True),
        ("2.5", True),
        (2.5, True),
        ("500ms", True),
        ("1h 30m", True),
        ("5x", False),
        ("30s later", False),
        ("1.2.3", False),
        ("", False),
        (-1, False),
    ],
)
def test_the_exported_schema_takes_the_durations_the_loader_takes(value: object, valid: bool) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(job_json_schema())
    job = {"entry": "t.py", "checkpoint": {"grace_period": value}}
    assert validator.is_valid(job) is valid, f"schema on grace_period: {value!r}"
    try:
        parse_duration(value)
    except ValueError:
        assert not valid, f"the loader refuses {value!r}"
    else:
        assert valid, f"the loader takes {value!r}"


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("1h30m", 5400), ("500ms", 0.5), (12, 12), ("2.5", 2.5)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["-1", "soon", "5x", "", "1m x"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
