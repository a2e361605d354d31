"""What every rank's environment gets that torchrun sets too, and the structured error a rank leaves.

- ``TORCHELASTIC_ERROR_FILE``: one file per rank (``<log_dir>/error_files/rank_<N>.json``,
  cleared before each attempt). A script whose main is decorated with torch's ``@record``
  writes its exception there; mlaunch puts its message and traceback in the failure summary.
- ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (the stop signals mlaunch forwards),
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` (a failed NCCL collective raises instead of hanging),
  unless job.yaml's env or mlaunch's own environment sets them;
- ``PWD``: the rank's working directory (what a shell would say there).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from launchers.config.job import Job
from launchers.plan import LaunchPlan, ProcessSpec

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
DEFAULTS = {
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def add_rank_env(job: Job, plan: LaunchPlan) -> None:
    for proc in plan.processes:
        for name, value in DEFAULTS.items():
            if name not in proc.env and name not in os.environ:
                proc.env[name] = value
        proc.env["PWD"] = proc.cwd
        if proc.rank >= 0 and ERROR_FILE not in proc.env:
            proc.env[ERROR_FILE] = str(job.log_path / "error_files" / f"rank_{proc.rank}.json")


def clear_error_files(plan: LaunchPlan) -> None:
    """An attempt starts with no error file left by the one before."""
    for proc in plan.processes:
        if proc.env.get(ERROR_FILE):
            with contextlib.suppress(OSError):
                os.unlink(proc.env[ERROR_FILE])


def error_file_lines(processes: list[ProcessSpec], rank: int) -> list[str]:
    """The message and traceback the failed rank's ``@record`` wrote, as summary lines (none when it wrote none)."""
    spec = next((p for p in processes if p.rank == rank and p.env.get(ERROR_FILE)), None)
    if spec is None:
        return []
    try:
        data = json.loads(Path(spec.env[ERROR_FILE]).read_text())
    except (OSError, ValueError):
        return []
    body = data.get("message") if isinstance(data, dict) else None
    if isinstance(body, dict):
        message = str(body.get("message", ""))
        extra = body.get("extraInfo")
        trace = str(extra.get("py_callstack", "")) if isinstance(extra, dict) else ""
    else:
        message, trace = str(body or ""), ""
    lines = [f"error recorded by rank {rank} ({spec.env[ERROR_FILE]}): {message.strip()}"]
    lines.extend(f"    {line}" for line in trace.strip().splitlines()[-15:])
    return lines
