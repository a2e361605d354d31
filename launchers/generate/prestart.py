"""``ma_pre_start.sh`` from job.yaml's ``prestart:`` section, and what it shares with the entrypoint.

The script is rendered from ``templates/ma_pre_start.sh.j2``; this module checks the section
(nothing is written when it is wrong), works out the paths the script uses *relative to its
own location* (ModelArts copies the code directory somewhere else on the node) and writes
the file atomically. Every value from job.yaml reaches the script through the ``sh`` filter.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from launchers.atomic import write_atomic
from launchers.config.job import Job
from launchers.errors import UserError
from launchers.findings import Finding

PRESTART_NAME = "ma_pre_start.sh"
HELPER_DELIMITER = "MLAUNCH_HELPER_PY"
GLOB_CHARS = set("*?[")


def comment_text(value: str) -> str:
    """A value shown in a ``#`` comment: JSON-escaped, so a newline in it cannot end the comment."""
    return json.dumps(value)


def python_candidates(job: Job) -> list[str]:
    """Interpreters the scripts try, in order, when ``MLAUNCH_PYTHON`` is not set."""
    return [job.python] if job.python else ["python3", "python"]


def helper_source() -> str:
    """launchers/generate/prestart_helper.py, embedded verbatim in a quoted here-document."""
    text = resources.files("launchers.generate").joinpath("prestart_helper.py").read_text(encoding="utf-8")
    if any(line.strip() == HELPER_DELIMITER for line in text.splitlines()):
        raise RuntimeError(f"prestart_helper.py contains the here-document delimiter {HELPER_DELIMITER}")
    return text.rstrip("\n")


def common_context(job: Job, tag: str) -> dict[str, Any]:
    """What templates/_script_common.sh.j2 needs."""
    return {
        "tag": tag,
        "python_candidates": python_candidates(job),
        "helper_source": helper_source(),
        "helper_delimiter": HELPER_DELIMITER,
        "job_name_json": comment_text(job.job_name),
    }


def relative_to_script(target: Path, script: Path) -> str:
    """``target`` as a path relative to the script's directory (both absolute)."""
    return os.path.relpath(target, script.parent)


def env_file_of(script: Path) -> Path:
    """Where a pre-start script leaves its environment: ``ma_pre_start.sh`` → ``ma_pre_start.env``."""
    return script.with_suffix(".env") if script.suffix == ".sh" else script.with_name(script.name + ".env")


def output_path(job: Job, out: str | None, default_name: str) -> Path | None:
    """``-o`` as an absolute path (default: ``<code_dir>/<default_name>``); None for ``-`` (stdout)."""
    if out == "-":
        return None
    path = Path(out).expanduser() if out else job.code_path / default_name
    path = path.resolve()
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: the directory {path.parent} does not exist")
    if path.is_dir():
        raise UserError(f"{path} is a directory; give the script's file name, e.g. -o {path / default_name}")
    return path


def write_script(path: Path | None, text: str) -> None:
    """Write atomically with mode 0755 (``None``: print to stdout)."""
    if path is None:
        sys.stdout.write(text)
        return
    try:
        write_atomic(path, text.encode("utf-8"), 0o755)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None


# ----------------------------------------------------------------------------------------
# The pre-start script
# ----------------------------------------------------------------------------------------


def _where(job: Job, key: str) -> str:
    return f"{job.source}: prestart.{key}" if job.source else f"prestart.{key}"


def _check_wheel_pattern(job: Job, index: int, pattern: str) -> None:
    where = _where(job, f"wheels[{index}]")
    if not pattern.strip():
        raise UserError(f"{where} is empty; expected a wheel file or glob such as dist/mlaunch-*.whl")
    path = PurePosixPath(pattern)
    if path.is_absolute() or pattern.startswith("~") or ".." in path.parts:
        raise UserError(
            f"{where} = {pattern!r} must stay inside prestart.dir (relative, no '..'), because cleanup removes "
            "what it matches; set prestart.dir to install from another directory"
        )
    if not pattern.endswith(".whl"):
        raise UserError(f"{where} = {pattern!r} must name wheel files (ending in .whl), e.g. dist/mlaunch-*.whl")


def work_dir_of(job: Job) -> tuple[Path, bool]:
    """(the directory the pre-start enters, whether job.yaml gave it as an absolute path)."""
    opts = job.prestart
    if opts.dir is None:
        return job.code_path, False
    given = Path(opts.dir).expanduser()
    if given.is_absolute():
        return given, True
    return (job.code_path / given).resolve(), False


def prestart_context(job: Job, script: Path) -> dict[str, Any]:
    opts = job.prestart
    for index, pattern in enumerate(opts.wheels):
        _check_wheel_pattern(job, index, pattern)
    both = sorted(set(opts.passthrough) & set(opts.env))
    if both:
        raise UserError(f"{_where(job, 'passthrough')}: {', '.join(both)} also set in prestart.env; keep one")
    if opts.requirements is not None and not opts.requirements.strip():
        raise UserError(f"{_where(job, 'requirements')} is empty; name a requirements file or remove the key")
    work_dir, absolute = work_dir_of(job)
    pip_args: list[str] = ["--no-index"] if opts.offline else []
    for link in opts.find_links or (["."] if opts.offline else []):
        pip_args += ["--find-links", link]
    return {
        **common_context(job, "[ma-pre-start]"),
        "work_dir": str(work_dir) if absolute else relative_to_script(work_dir, script),
        "work_dir_absolute": absolute,
        "env_file_name": env_file_of(script).name,
        "env_file_name_json": comment_text(env_file_of(script).name),
        "wheels": list(opts.wheels),
        "requirements": opts.requirements,
        "commands": list(opts.commands),
        "env": sorted(opts.env.items()),
        "passthrough": list(opts.passthrough),
        "cleanup": opts.cleanup,
        "pip_args": pip_args,
    }


def render_prestart(job: Job, script: Path) -> str:
    """The text of ma_pre_start.sh for ``job``, to be saved at ``script`` (an absolute path)."""
    from launchers.templating import render

    return render("ma_pre_start.sh.j2", **prestart_context(job, script))


def advise(job: Job, script: Path) -> list[str]:
    """Things worth telling the user before they upload the code directory (not errors)."""
    notes = []
    if script.name != PRESTART_NAME or script.parent != job.code_path:
        notes.append(f"ModelArts runs only {job.code_path / PRESTART_NAME} by itself; the entrypoint runs {script}")
    work_dir, absolute = work_dir_of(job)
    if absolute or not work_dir.is_dir():
        return notes
    matched: list[str] = []
    for pattern in job.prestart.wheels:
        found = sorted(p.name for p in work_dir.glob(pattern) if p.is_file())
        if not found:
            notes.append(f"prestart.wheels: nothing matches {pattern!r} in {work_dir} yet; the script will stop there")
        matched += found
    if not any(name.startswith("mlaunch-") for name in matched):
        notes.append(
            "no mlaunch wheel among prestart.wheels: the entrypoint needs mlaunch on the node; "
            "run `mlaunch wheel -o dist` and add dist/mlaunch-*.whl (unless the image already has mlaunch)"
        )
    return notes


def check_prestart(job: Job, plan: object) -> list[Finding]:
    """``mlaunch check``: findings for the prestart: section, when there is one."""
    opts = job.prestart
    if not (opts.wheels or opts.requirements or opts.commands or opts.env or opts.passthrough):
        return []
    script = job.code_path / PRESTART_NAME
    try:
        prestart_context(job, script)
    except UserError as exc:
        return [Finding("error", str(exc))]
    found = [Finding("ok", f"prestart: {len(opts.wheels)} wheel pattern(s), {len(opts.env)} env value(s)")]
    found += [Finding("warning", message) for message in advise(job, script)]
    if not script.exists():
        found.append(Finding("note", f"{script} does not exist yet: mlaunch prestart {job.source or 'job.yaml'}"))
    return found
