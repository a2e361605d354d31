"""``mlaunch prestart``: generate ma_pre_start.sh from job.yaml's ``prestart:`` section."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def prestart(
    job_file: Annotated[Path, typer.Argument(help="the job.yaml file", show_default=False)],
    out: Annotated[
        str | None,
        typer.Option("--output", "-o", help="where to write the script ('-' for stdout)", show_default=False),
    ] = None,
) -> None:
    """Generate ma_pre_start.sh (default: <code_dir>/ma_pre_start.sh) from job.yaml's prestart: section.

    The script enters prestart.dir (default: code_dir), installs prestart.wheels (globs allowed) and prestart.requirements with pip, runs prestart.commands, exports prestart.env and leaves it in ma_pre_start.env for the start file. A second run does nothing; it passes shellcheck and quotes every value.

      mlaunch wheel -o dist && mlaunch prestart job.yaml -o ma_pre_start.sh
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.config.job import load_job
    from launchers.generate.prestart import PRESTART_NAME, advise, output_path, render_prestart, write_script
    from launchers.log import say

    job = load_job(job_file)
    path = output_path(job, out, PRESTART_NAME)
    script = path or job.code_path / PRESTART_NAME
    text = render_prestart(job, script)
    write_script(path, text)
    for message in advise(job, script):
        say(f"note: {message}")
    if path is not None:
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command(name="prestart")(prestart)
