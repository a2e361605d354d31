"""``mlaunch sbatch``: generate a Slurm batch script that runs the job with one mlaunch per node."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def sbatch(
    job_file: Annotated[Path, typer.Argument(help="the job.yaml file", show_default=False)],
    engine: Annotated[
        str | None,
        typer.Option("--engine", "-e", help="ascend | pytorch | tensorflow | mpi (default: job.yaml's engine:)"),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option("--output", "-o", help="where to write the script ('-' for stdout)", show_default=False),
    ] = None,
) -> None:
    """Generate job.sbatch (default: <code_dir>/job.sbatch) for `sbatch`: nodes × 1 task, srun mlaunch on every node.

    SIGUSR1 before the time limit (slurm.signal_before) becomes a graceful stop of every node's mlaunch; the exit codes in slurm.requeue_exit_codes requeue the job, which resumes from its checkpoint. Options come from the slurm: section of job.yaml.

      mlaunch sbatch job.yaml -o job.sbatch && sbatch job.sbatch
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.config.job import load_job
    from launchers.generate.entrypoint import engine_of
    from launchers.generate.prestart import output_path, write_script
    from launchers.generate.sbatch import SBATCH_NAME, cluster_kill_wait, render_sbatch, sbatch_notes
    from launchers.log import say

    job = load_job(job_file)
    name = engine_of(job, engine)
    path = output_path(job, out, SBATCH_NAME)
    write_script(path, render_sbatch(job, name))
    kill_wait = None if job.slurm.kill_wait is not None else cluster_kill_wait()
    for message in sbatch_notes(job, kill_wait):
        say(f"note: {message}")
    if path is not None:
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.command(name="sbatch")(sbatch)
