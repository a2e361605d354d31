"""``mlaunch wheel``: build mlaunch's own wheel so a job can carry it in its code directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def wheel(
    out_dir: Annotated[
        Path, typer.Option("--out-dir", "-o", help="directory to write the wheel into (created if missing)")
    ] = Path("dist"),
) -> None:
    """Build mlaunch's wheel (launchers incl. launchers.elastic, bootstrap, templates), offline.

    Works from a source checkout and from an installed mlaunch alike; no registry, no build backend, the same bytes every time. Put the wheel in the job's code directory and list it in job.yaml's prestart.wheels so the generated ma_pre_start.sh installs it on every node:

      mlaunch wheel -o dist        # dist/mlaunch-<version>-py3-none-any.whl

      # then in job.yaml, under prestart.wheels:  - dist/mlaunch-*.whl
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.generate.wheel import build_mlaunch_wheel

    path = build_mlaunch_wheel(out_dir)
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command(name="wheel")(wheel)
