"""``mlaunch entrypoint``: generate the container's start script for a job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def entrypoint(
    job_file: Annotated[Path, typer.Argument(help="the job.yaml file", show_default=False)],
    engine: Annotated[
        str | None,
        typer.Option("--engine", "-e", help="ascend | pytorch | tensorflow | mpi (default: job.yaml's engine:)"),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option("--output", "-o", help="where to write the script ('-' for stdout)", show_default=False),
    ] = None,
    prestart: Annotated[
        Path | None,
        typer.Option("--prestart", help="the pre-start script it runs (default: <code_dir>/ma_pre_start.sh)"),
    ] = None,
) -> None:
    """Generate entrypoint.sh (default: <code_dir>/entrypoint.sh), the container's start command.

    `bash entrypoint.sh ARGS...` runs ma_pre_start.sh when present, loads the environment it left, then execs mlaunch (on the Python the pre-start installed into) with the job file and every argument the platform appends, so the platform's SIGTERM reaches mlaunch directly.

      mlaunch wheel -o dist && mlaunch prestart job.yaml && mlaunch entrypoint job.yaml -o entrypoint.sh
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.config.job import load_job
    from launchers.generate.entrypoint import ENTRYPOINT_NAME, advise, engine_of, render_entrypoint
    from launchers.generate.prestart import PRESTART_NAME, output_path, write_script
    from launchers.log import say

    job = load_job(job_file)
    name = engine_of(job, engine)
    path = output_path(job, out, ENTRYPOINT_NAME)
    script = path or job.code_path / ENTRYPOINT_NAME
    prestart_path = prestart.expanduser().resolve() if prestart else job.code_path / PRESTART_NAME
    write_script(path, render_entrypoint(job, name, script, prestart_path))
    for message in advise(job, script, prestart_path):
        say(f"note: {message}")
    if path is not None:
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command(name="entrypoint")(entrypoint)
