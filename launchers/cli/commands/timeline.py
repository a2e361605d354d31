"""``mlaunch timeline job.yaml -o FILE``: the job's life as one picture (``.png``) or page (``.html``).

Reads what every node's mlaunch already writes under ``log_dir`` (``events.jsonl``, and
``status.json`` for a job still running), or the directories and files ``--logs`` names (each
node's log directory gathered in one place); draws the newest run (``launchers.observe.timeline_*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

FORMATS = (".png", ".html")


def timeline(
    job_file: Annotated[Path, typer.Argument(help="the job.yaml file", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="the picture: FILE.png, or FILE.html (hover details)")],
    logs: Annotated[
        list[Path] | None,
        typer.Option(
            "--logs",
            help="read these log directories (searched for events.jsonl) or events files instead of job.yaml's "
            "log_dir; repeat it for each node's logs gathered",
        ),
    ] = None,
) -> None:
    """Draw the job's life: steps per node, each fault where it hit, restarts and resumes, commits, membership changes, stragglers, hangs, and where the time went.

    mlaunch timeline job.yaml -o timeline.png          mlaunch timeline job.yaml -o timeline.html          mlaunch timeline job.yaml --logs gathered/ -o all.png
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.config.job import load_job
    from launchers.errors import UserError

    suffix = output.suffix.lower()
    if suffix not in FORMATS:
        raise UserError(f"--output {output}: the picture is a .png or an .html file (by its suffix), not {suffix!r}")
    job = load_job(job_file)
    sources = list(logs) if logs else [job.log_path]
    missing = [str(p) for p in sources if not p.exists()]
    if missing:
        raise UserError(f"no logs at {', '.join(missing)} (has this job been run with this log_dir?)")
    try:
        import matplotlib  # noqa: F401 - the drawing's one optional dependency
    except ImportError:
        raise UserError(
            "mlaunch timeline draws with matplotlib, which is not installed: pip install 'mlaunch[timeline]'"
        ) from None
    from launchers.observe import timeline_model

    events, statuses = timeline_model.gather(sources)
    if not events:
        where = ", ".join(str(p) for p in sources)
        raise UserError(f"no events in {where}: nothing to draw (each node's mlaunch writes <log_dir>/events.jsonl)")
    drawn = timeline_model.build(events, statuses, job.job_name)
    try:
        if suffix == ".png":
            from launchers.observe.timeline_draw import save_png

            save_png(drawn, output)
        else:
            from launchers.observe.timeline_html import render

            output.write_text(render(drawn, timeline_model.newest_run(events)), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}") from None
    faults = len(drawn.faults())
    typer.echo(f"timeline of {drawn.job} ({drawn.phase}, {len(drawn.nodes)} node(s), {faults} fault(s)): {output}")


def register(app: typer.Typer) -> None:
    app.command(name="timeline")(timeline)
