"""Before anything is launched: what the run would trip on and that can be known now.

One list of checks, used twice: ``mlaunch check`` prints them as findings, the run path
(``run_job``) refuses to start on the first error (exit 2, nothing launched) instead of
ending with the shell's 127 after the start file ran half-way.

- ``code_dir`` exists and is a directory (every process's working directory, also with an absolute
  ``entry``); the start file exists (``check_entry_exists``);
- the interpreter for a ``.py`` start file (``python:``, else mlaunch's own) is found and executable;
- no NUL or line break in what reaches a command line (argv of every planned process), no NUL in its env;
- ``log_dir`` and ``checkpoint.dir`` exist as writable directories or can be created (nothing is created here).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from launchers.config.job import Job
from launchers.errors import UserError
from launchers.plan import LaunchPlan


def preflight_errors(job: Job, plan: LaunchPlan) -> list[str]:
    """Every problem the run would hit before the start file runs; empty when it may launch."""
    problems = _code_and_entry(job)
    problems += _interpreter(job)
    problems += _command_lines(plan)
    for key, value in (("log_dir", job.log_dir), ("checkpoint.dir", job.checkpoint.dir)):
        problem = _creatable(job.resolve(value))
        if problem:
            problems.append(f"{key}: {value!r} → {problem}")
    return problems


def check_launchable(job: Job, plan: LaunchPlan) -> None:
    """Raise ``UserError`` (exit 2) with every preflight problem; the run path calls this before launching."""
    problems = preflight_errors(job, plan)
    if problems:
        src = f"{job.source}: " if job.source else ""
        raise UserError(src + "nothing was launched:\n" + "\n".join(f"  {p}" for p in problems))


def _code_and_entry(job: Job) -> list[str]:
    code = job.code_path
    if not code.is_dir():  # the processes' working directory, even when the start file is elsewhere
        what = "is not a directory" if code.exists() else "does not exist"
        why = "the processes' working directory: it must exist, also with an absolute entry"
        return [f"code_dir: {job.code_dir!r} → {code} {what} ({why})"]
    from launchers.engines.base import check_entry_exists

    try:
        check_entry_exists(job)
    except UserError as exc:
        return [f"entry: {exc}"]
    return []


def _interpreter(job: Job) -> list[str]:
    """``python:`` names an interpreter that exists and may be executed (only for a .py start file)."""
    if job.entry_path.suffix.lower() != ".py" or job.python is None:
        return []
    named = job.python
    if os.sep not in named:
        found = shutil.which(named)
        return [] if found else [f"python: {named!r} is not found on PATH"]
    path = Path(named).expanduser()
    candidates = [path] if path.is_absolute() else [job.code_path / path, job.base_dir / path]
    existing = [c for c in candidates if c.exists()]
    if not existing:
        return [f"python: {named!r} → {candidates[0]} does not exist"]
    if existing[0].is_dir() or not os.access(existing[0], os.X_OK):
        return [f"python: {named!r} → {existing[0]} is not an executable file"]
    return []


def _command_lines(plan: LaunchPlan) -> list[str]:
    """NUL in an argument or the env of any planned process: execve would refuse it."""
    for node in plan.nodes:
        for proc in node.processes:
            for word in proc.argv:
                if "\x00" in word:
                    return [f"argument {word!r} of {proc.argv[0]} holds a NUL character"]
            for name, value in proc.env.items():
                if "\x00" in name or "\x00" in value:
                    return [f"environment {name!r} holds a NUL character"]
    return []


def _creatable(path: Path) -> str | None:
    """Why ``path`` cannot be (or become) a writable directory, or None."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe == path and not path.is_dir():
        return f"{path} exists and is not a directory"
    if not probe.is_dir():
        return f"{probe} is not a directory, so {path} cannot be created"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable, so {path} cannot be created" if probe != path else f"{path} is not writable"
    return None
