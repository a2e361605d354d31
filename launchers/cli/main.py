"""The ``mlaunch`` console entry point.

The common case — a platform starting ``mlaunch --engine E job.yaml [platform args...]`` on
every node — takes a fast path that parses its few options by hand and never imports typer:
launch overhead is paid on every node and every restart. Every other command (``plan``,
``check``, ``schema``, ``prestart``..., any ``--help``) goes through the typer application in
``launchers.cli.app``, which defines the same ``run`` command for help and completeness.

User mistakes exit 2 with a one-paragraph message; never a traceback.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from launchers import stop_signals as early_signals
from launchers.cli import pydantic_plugins
from launchers.errors import EXIT_USER_ERROR, UserError
from launchers.log import say

_HELP = ("--help", "-h", "--version")


@dataclass
class RunArgs:
    job_file: str
    engine: str | None = None
    simulate: bool = False
    extra: list[str] = field(default_factory=list)


def parse_fast_run(args: list[str], commands: set[str]) -> RunArgs | None:
    """Parse ``[run] [--engine E|-e E|--engine=E] [--simulate] JOB [extra...]``; None → use typer.

    mlaunch's own options are recognised anywhere (as click does); every other token after the
    job file is an extra argument for the platform reader or the start file.
    """
    if not args:
        return None
    rest = args[1:] if args[0] == "run" else args
    if args[0] != "run" and args[0] in commands:
        return None
    parsed = RunArgs(job_file="")
    i = 0
    while i < len(rest):
        token = rest[i]
        if token in _HELP:
            return None
        if token in ("--engine", "-e"):
            if i + 1 >= len(rest):
                return None  # let typer report the missing value
            parsed.engine = rest[i + 1]
            i += 2
            continue
        if token.startswith("--engine="):
            parsed.engine = token.split("=", 1)[1]
        elif token == "--simulate":
            parsed.simulate = True
        elif token == "--":
            parsed.extra.extend(rest[i + 1 :])
            break
        elif not parsed.job_file and not token.startswith("-"):
            parsed.job_file = token
        elif not parsed.job_file:
            return None  # an unknown option before the job file: typer explains it
        else:
            parsed.extra.append(token)
        i += 1
    job = parsed.job_file
    if not job or not (job.endswith((".yaml", ".yml")) or os.path.isfile(job)):
        return None  # not obviously a job file (maybe a command): typer decides
    return parsed


def _command_names() -> set[str]:
    """Core command names plus one per extension module (modules are named after their command)."""
    import pkgutil

    import launchers.cli.commands as package

    names = {"run", "plan", "schema", "check"}
    names.update(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
    return names


def _fast_run(run: RunArgs) -> int:
    from launchers.config.job import load_job
    from launchers.run.runner import resolve_engine_name, run_job

    job = load_job(run.job_file)
    return run_job(job, resolve_engine_name(job, run.engine), run.extra, simulate=run.simulate)


def main(argv: list[str] | None = None) -> Any:
    """Console entry point: user errors → exit 2 and a message; the job's code otherwise."""
    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None:  # the real entry point (maybe a container's PID 1): keep any early stop signal
        early_signals.install()
        pydantic_plugins.install()
    try:
        fast = parse_fast_run(args, _command_names())
        if fast is not None:
            sys.exit(_fast_run(fast))
        early_signals.uninstall()
        sys.exit(_typer_main(args))
    except UserError as exc:
        say(f"error: {exc}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        say("aborted")
        sys.exit(130)
    except BrokenPipeError:
        # `mlaunch plan | head`: the reader left; nothing to report.
        os._exit(0)


def _command_line_errors() -> tuple[type[Exception], ...]:
    """What typer raises for a bad command line (usage errors, bad parameters), by public names only.

    typer ≥ 0.20 vendors click and derives click's exceptions from ``typer.TyperException``;
    older releases raise click's own, and depend on click.
    """
    import typer

    vendored = getattr(typer, "TyperException", None)
    if vendored is not None:
        return (vendored,)
    import importlib

    return (importlib.import_module("click").ClickException,)  # pragma: no cover - depends on the installed typer


def _typer_main(args: list[str]) -> int:
    import typer

    from launchers.cli.app import app

    try:
        result = app(args=args, prog_name="mlaunch", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        say("aborted")
        return 130
    except _command_line_errors() as exc:
        show = getattr(exc, "show", None)  # click's exceptions print usage, hint and message
        if show is not None:
            show()
        else:  # pragma: no cover - typer's own exceptions carry only a message
            say(f"error: {exc}")
        return int(getattr(exc, "exit_code", 0) or EXIT_USER_ERROR)
    return result if isinstance(result, int) else 0


def __getattr__(name: str) -> Any:
    """``launchers.cli.main.app`` stays importable (typer's CliRunner, tests) without a start-up cost."""
    if name == "app":
        from launchers.cli.app import app

        return app
    raise AttributeError(name)
