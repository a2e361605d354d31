"""``mlaunch health``: run the node health check of job.yaml's ``health_check:`` on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def health(
    ctx: typer.Context,
    job_file: Annotated[Path, typer.Argument(help="the job.yaml file", show_default=False)],
    engine: Annotated[
        str | None,
        typer.Option("--engine", "-e", help="ascend | pytorch | tensorflow | mpi (default: job.yaml's engine:)"),
    ] = None,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="ignore platform env and simulate the cluster on this machine")
    ] = False,
) -> None:
    """Check every node before training: compute, device memory in use, the checkpoint directory, the links.

    Run it like the job itself (one per node with the platform's env or appended args, or once for a local simulation). Node 0 prints one table and writes <log_dir>/health.json. Exit 0 when every node is ok, 75 when a node is a straggler or faulty (whatever health_check.on_failure says).

      mlaunch health --engine pytorch job.yaml --init_method tcp://10.0.0.1:6666 --rank 1 --world_size 4
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.config.job import load_job
    from launchers.control import open_job_events
    from launchers.engines import get_engine
    from launchers.health.check import HEALTH_EXIT_CODE, run_health
    from launchers.planning import resolve_engine_name

    job = load_job(job_file)
    cluster = get_engine(resolve_engine_name(job, engine)).detect(job, _environ(), list(ctx.args), simulate=simulate)
    from launchers.health.network import REDUCERS

    events = open_job_events(job, cluster, REDUCERS)  # node 0's hub pairs the links
    code = 1
    try:
        outcome = run_health(job, cluster, events)
        code = HEALTH_EXIT_CODE if outcome.bad or outcome.incomplete else 0
        if outcome.incomplete:
            from launchers.log import say

            say(f"health check incomplete on this node: {outcome.incomplete}")
    finally:
        events.close(code)
    raise typer.Exit(code)


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def register(app: typer.Typer) -> None:
    app.command(name="health", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(health)
