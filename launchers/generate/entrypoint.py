"""The container entrypoint script (``templates/entrypoint.sh.j2``) for a job.

``bash entrypoint.sh [platform args]`` runs the pre-start (when present), loads what it left
in ``ma_pre_start.env``, and ``exec``s mlaunch with the job file and every appended argument.
Paths in the script are relative to the script's own directory, because the platform copies the
code directory to a path of its own. mlaunch is exec'd from the Python the pre-start installed
into (its ``mlaunch`` console script, else ``python -m launchers``), never whichever ``mlaunch``
PATH finds first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launchers.config.job import Job
from launchers.errors import UserError
from launchers.generate.prestart import common_context, env_file_of, relative_to_script

ENTRYPOINT_NAME = "entrypoint.sh"


def engine_of(job: Job, engine: str | None) -> str:
    """``--engine`` or job.yaml's ``engine:``; a name mlaunch does not know is a user error now, not on the node."""
    from launchers.engines import ENGINE_MODULES

    name = engine or job.engine
    if not name:
        raise UserError(f"no engine given: pass --engine {'|'.join(ENGINE_MODULES)} or set `engine:` in {job.source}")
    if name not in ENGINE_MODULES:
        raise UserError(f"unknown engine {name!r}; expected one of: {', '.join(ENGINE_MODULES)}")
    return name


def entrypoint_context(job: Job, engine: str, script: Path, prestart: Path) -> dict[str, Any]:
    if job.source is None:
        raise UserError("the entrypoint needs a job.yaml file on disk")
    return {
        **common_context(job, "[mlaunch-entrypoint]"),
        "engine": engine,
        "job_file": relative_to_script(job.source, script),
        "prestart": relative_to_script(prestart, script),
        "prestart_env": relative_to_script(env_file_of(prestart), script),
    }


def render_entrypoint(job: Job, engine: str, script: Path, prestart: Path) -> str:
    """The text of entrypoint.sh, to be saved at ``script``; ``prestart`` is the pre-start it runs."""
    from launchers.templating import render

    return render("entrypoint.sh.j2", **entrypoint_context(job, engine, script, prestart))


def advise(job: Job, script: Path, prestart: Path) -> list[str]:
    """What the user should know before uploading the code directory."""
    notes = []
    code = job.code_path
    for what, path in (("job file", job.source), ("entrypoint", script), ("pre-start script", prestart)):
        if path is not None and not path.is_relative_to(code):
            notes.append(f"the {what} {path} is outside the code directory {code}: upload it too, at the same place")
    if not prestart.exists():
        notes.append(f"{prestart} does not exist (yet); the entrypoint skips the pre-start while it is missing")
    return notes
