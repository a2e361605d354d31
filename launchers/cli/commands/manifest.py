"""``mlaunch manifest``: the Kubernetes YAML that runs a job under Volcano, Kubeflow or MindCluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def manifest(
    job_file: Annotated[Path, typer.Argument(help="the job.yaml file", show_default=False)],
    target: Annotated[
        str,
        typer.Option(
            "--target", "-t", help="volcano | pytorchjob | tfjob | mpijob | ascendjob | trainjob", show_default=False
        ),
    ],
    engine: Annotated[
        str | None,
        typer.Option("--engine", "-e", help="ascend | pytorch | tensorflow | mpi (default: job.yaml's engine:)"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="write to this file instead of standard output")
    ] = None,
    cluster_runtime: Annotated[
        bool,
        typer.Option("--cluster-runtime", help="trainjob: reference a ClusterTrainingRuntime, not a TrainingRuntime"),
    ] = False,
) -> None:
    """Write the Kubernetes manifest that runs this job: one pod per node, `mlaunch` inside each.

    Image, resources, volumes, MindCluster labels: job.yaml's `kubernetes:` section.

    Restarts and the termination grace period: `restart:` and `checkpoint:`.

    Nothing from job.yaml's `env:` is copied: mlaunch applies it inside the pod.

    Every run writes a Secret `<job>-mlaunch-key` with a new random control-plane key, read by every pod as MLAUNCH_JOB_SECRET: keep the file private (-o writes it readable by its owner only).

      mlaunch manifest --target pytorchjob examples/k8s/pytorch.yaml -o pytorchjob.yaml

      mlaunch manifest -t volcano job.yaml | kubectl apply -f -

      mlaunch manifest -t trainjob job.yaml -o trainjob.yaml   (Kubeflow Trainer v2)
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.config.job import load_job
    from launchers.errors import UserError
    from launchers.generate.k8s.manifests import TARGETS, build, render
    from launchers.planning import resolve_engine_name

    if target not in TARGETS:
        raise UserError(f"unknown --target {target!r}; expected one of: {', '.join(TARGETS)}")
    job = load_job(job_file)
    engine_name = resolve_engine_name(job, engine)
    built = build(job, target, engine_name, cluster_runtime=cluster_runtime)
    text = render(built, job, engine_name, str(output) if output else None)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        _write_private(output, text)
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}") from None
    kinds = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in built.documents)
    typer.echo(f"wrote {output} ({kinds}); apply with: kubectl apply -f {output}", err=True)


def register(app: typer.Typer) -> None:
    app.command(name="manifest")(manifest)


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its owner only (it holds the job's control-plane key)."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file that existed keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
