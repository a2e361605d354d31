"""The typer application behind ``mlaunch`` (every command but the fast ``run`` path).

``mlaunch --engine pytorch job.yaml [platform args...]`` is ``mlaunch run ...``: a first
argument that is not a command name routes to ``run``, because that is what a platform's
start command looks like. Arguments after the job file that mlaunch does not own are
accepted: the platform's (``--init_method``, ``--rank``, ``--world_size``, TF's
``--ps_hosts``...) are read, the rest is passed to the start file.

Commands beyond the core live in ``launchers/cli/commands/<name>.py`` and register themselves
through ``register(app)``; heavy imports stay inside the command functions.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from launchers import __version__


class _DefaultRunGroup(TyperGroup):
    """Route ``mlaunch [--engine E] job.yaml ...`` to ``run``."""

    GROUP_OPTIONS = ("--help", "-h", "--version", "--install-completion", "--show-completion")

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if args and args[0] not in self.commands and args[0] not in self.GROUP_OPTIONS:
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_DefaultRunGroup,
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Launch distributed training jobs on ModelArts-style platforms, or simulate them locally.\n\n"
    "mlaunch --engine pytorch job.yaml   runs the job (same as `mlaunch run`).",
)

EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}

EngineOpt = Annotated[
    str | None,
    typer.Option("--engine", "-e", help="ascend | pytorch | tensorflow | mpi (default: job.yaml's engine:)"),
]
JobArg = Annotated[Path, typer.Argument(help="the job.yaml file", show_default=False)]
SimulateOpt = Annotated[
    bool, typer.Option("--simulate", help="ignore platform env and simulate the cluster on this machine")
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlaunch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")
    ] = False,
) -> None:
    """Launch distributed training jobs on ModelArts-style platforms, or simulate them locally."""


@app.command(context_settings=EXTRA)
def run(ctx: typer.Context, job_file: JobArg, engine: EngineOpt = None, simulate: SimulateOpt = False) -> None:
    """Run this node's share of the job (all nodes, simulated, when no platform env is present).

    Examples:

      mlaunch --engine pytorch examples/pytorch/job.yaml

      mlaunch --engine pytorch job.yaml --init_method tcp://10.0.0.1:6666 --rank 1 --world_size 2
    """
    from launchers.config.job import load_job
    from launchers.run.runner import resolve_engine_name, run_job

    job = load_job(job_file)
    code = run_job(job, resolve_engine_name(job, engine), list(ctx.args), simulate=simulate)
    raise typer.Exit(code)


@app.command(context_settings=EXTRA)
def plan(
    ctx: typer.Context,
    job_file: JobArg,
    engine: EngineOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    simulate: SimulateOpt = False,
) -> None:
    """Print what would run, per node and rank (argv, env, cwd), without starting anything.

    It reads the same platform env and appended arguments as a run, so you can see exactly
    what a platform node would start:

      mlaunch plan --engine pytorch job.yaml --json

      MA_NUM_HOSTS=2 VC_TASK_INDEX=1 mlaunch plan -e pytorch job.yaml --init_method tcp://10.0.0.1:6666
    """
    from launchers.config.job import load_job
    from launchers.planning import make_plan, resolve_engine_name

    job = load_job(job_file)
    _, _, launch_plan = make_plan(job, resolve_engine_name(job, engine), list(ctx.args), simulate=simulate)
    if as_json:
        typer.echo(launch_plan.dumps())
    else:
        from launchers.cli.plan_view import print_plan

        print_plan(launch_plan)


@app.command()
def schema() -> None:
    """Print the JSON Schema of job.yaml (for editor completion and validation)."""
    from launchers.config.job import job_json_schema

    typer.echo(json.dumps(job_json_schema(), indent=2))


@app.command(context_settings=EXTRA)
def check(ctx: typer.Context, job_file: JobArg, engine: EngineOpt = None, simulate: SimulateOpt = False) -> None:
    """Validate job.yaml and the platform env, plan the job, and explain any problem.

    Exits 0 when the job could be launched as it stands, 2 otherwise.
    """
    from launchers.cli.check import run_checks

    raise typer.Exit(run_checks(job_file, engine, list(ctx.args), simulate=simulate))


def _register_extensions() -> None:
    """Commands in launchers/cli/commands/*.py add themselves with ``register(app)``."""
    import launchers.cli.commands as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"launchers.cli.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_extensions()
