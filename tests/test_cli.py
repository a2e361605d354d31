"""The command line: the fast `run` path, routing to typer, help and version."""

from __future__ import annotations

import pytest
from conftest import run_mlaunch

from launchers.cli.main import RunArgs, parse_fast_run

COMMANDS = {"run", "plan", "schema", "check", "prestart"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--engine", "pytorch", "job.yaml"], RunArgs("job.yaml", "pytorch")),
        (["run", "-e", "mpi", "job.yaml", "--rank", "1"], RunArgs("job.yaml", "mpi", extra=["--rank", "1"])),
        (["job.yaml", "--engine=ascend", "--simulate"], RunArgs("job.yaml", "ascend", True)),
        (
            ["--engine", "pytorch", "job.yaml", "--init_method", "tcp://h:1", "--world_size=2", "--data_url=x"],
            RunArgs("job.yaml", "pytorch", extra=["--init_method", "tcp://h:1", "--world_size=2", "--data_url=x"]),
        ),
        (["job.yml", "--", "--engine", "x"], RunArgs("job.yml", extra=["--engine", "x"])),
    ],
)
def test_fast_run_parsing(args: list[str], expected: RunArgs) -> None:
    assert parse_fast_run(args, COMMANDS) == expected


@pytest.mark.parametrize(
    "args",
    [[], ["plan", "job.yaml"], ["--help"], ["job.yaml", "--help"], ["--bogus", "job.yaml"], ["--engine"], ["prestart"]],
)
def test_everything_else_goes_to_typer(args: list[str]) -> None:
    assert parse_fast_run(args, COMMANDS) is None


def test_version_and_help() -> None:
    version = run_mlaunch(["--version"])
    assert version.returncode == 0 and version.stdout.startswith("mlaunch ")
    helped = run_mlaunch(["--help"])
    assert helped.returncode == 0
    for command in ("run", "plan", "schema", "check"):
        assert command in helped.stdout
    run_help = run_mlaunch(["run", "--help"])
    assert run_help.returncode == 0 and "--init_method" in run_help.stdout


def test_unknown_command_like_word_is_a_clear_error() -> None:
    result = run_mlaunch(["bogus"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
