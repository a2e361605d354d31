"""The sbatch script (``templates/sbatch.sh.j2``) for a job: one mlaunch per node under Slurm.

The script asks for ``nodes`` nodes with one task each and runs ``srun mlaunch --engine E
job.yaml`` in the background, so its shell can act on signals while the step runs:

- ``--signal=B:USR1@<lead>``: Slurm sends SIGUSR1 to the batch shell only (``B:``) ``lead``
  seconds before the time limit. mlaunch's graceful stop is SIGTERM, and SIGUSR1 sent to every
  task would only be forwarded to the ranks, so the shell turns it into ``scancel --signal=TERM
  $SLURM_JOB_ID``: Slurm delivers SIGTERM to every step's tasks (every node's mlaunch), not to
  the batch shell itself. Each mlaunch then stops its ranks, which save a dying checkpoint.
- When srun ends, its exit code (the highest of the nodes', 128+N for a signal) decides:
  ``slurm.requeue_exit_codes`` (default 143, 137) → ``scontrol requeue`` (at most
  ``slurm.max_requeues`` times, counted by Slurm in ``SLURM_RESTART_COUNT``); the requeued job
  resumes from the checkpoint. Anything else ends the job with that code.
- A scancel, a time limit or a preemption without the warning makes Slurm send SIGTERM to every
  task itself and SIGKILL ``KillWait`` seconds later: ``checkpoint.grace_period`` must fit in
  KillWait, which ``sbatch_notes`` checks.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from launchers.config.job import Job
from launchers.errors import UserError

SBATCH_NAME = "job.sbatch"
SIGNAL_MARGIN = 30.0  # seconds added to the grace period for the default --signal lead time
SLURM_DEFAULT_KILL_WAIT = 30.0  # slurm.conf KillWait when the cluster does not set it
MAX_SIGNAL_LEAD = 65_535  # sbatch --signal: @sig_time is at most 65535 seconds
_JOB_NAME_BAD = re.compile(r"[^A-Za-z0-9_.+-]+")


def slurm_time(seconds: float) -> str:
    """A duration as Slurm's ``D-HH:MM:SS`` (rounded up to whole minutes: Slurm's limits are minutes)."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def signal_lead(job: Job) -> int:
    """Seconds before the time limit at which the script starts the graceful stop."""
    lead = job.slurm.signal_before
    seconds = math.ceil(lead if lead is not None else job.checkpoint.grace_period + SIGNAL_MARGIN)
    if seconds > MAX_SIGNAL_LEAD:
        raise UserError(f"{job.source}: slurm.signal_before is {seconds}s; sbatch --signal allows at most 65535s")
    return seconds


def sbatch_context(job: Job, engine: str) -> dict[str, Any]:
    if job.source is None:
        raise UserError("the sbatch script needs a job.yaml file on disk")
    slurm = job.slurm
    options = [f"--job-name={_JOB_NAME_BAD.sub('-', job.job_name).strip('-') or 'mlaunch'}"]
    options += [f"--nodes={job.nodes}", "--ntasks-per-node=1", f"--signal=B:USR1@{signal_lead(job)}"]
    options += ["--requeue", "--open-mode=append"]
    if slurm.partition:
        options.append(f"--partition={slurm.partition}")
    if slurm.account:
        options.append(f"--account={slurm.account}")
    if slurm.time is not None:
        options.append(f"--time={slurm_time(slurm.time)}")
    if slurm.cpus_per_task is not None:
        options.append(f"--cpus-per-task={slurm.cpus_per_task}")
    if slurm.gpus_per_node is not None:
        options.append(f"--gpus-per-node={slurm.gpus_per_node}")
    return {
        "job_name_json": json.dumps(job.job_name),  # in a comment: JSON keeps a line break from ending it
        "sbatch_options": [*options, *slurm.extra],
        "srun_args": list(slurm.srun_args),
        "mlaunch": slurm.mlaunch,
        "engine": engine,
        "job_file": str(job.source.resolve()),
        "requeue_codes": [str(code) for code in sorted(set(slurm.requeue_exit_codes))],
        "max_requeues": slurm.max_requeues,
    }


def render_sbatch(job: Job, engine: str) -> str:
    from launchers.templating import render

    return render("sbatch.sh.j2", **sbatch_context(job, engine))


def cluster_kill_wait(timeout: float = 5.0) -> float | None:
    """KillWait from ``scontrol show config`` when scontrol is here and answers, else None."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        out = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"^KillWait\s*=\s*([0-9]{1,9})", out, re.MULTILINE)
    return float(found.group(1)) if found else None


def sbatch_notes(job: Job, kill_wait: float | None) -> list[str]:
    """What the user should know: the grace period against KillWait, where the files must be."""
    notes = []
    wait, said = (job.slurm.kill_wait, "slurm.kill_wait") if job.slurm.kill_wait is not None else (kill_wait, "")
    if wait is None:
        wait, said = SLURM_DEFAULT_KILL_WAIT, "Slurm's default KillWait"
    elif not said:
        said = "KillWait from `scontrol show config`"
    grace = job.checkpoint.grace_period
    if grace >= wait:
        notes.append(
            f"checkpoint.grace_period is {grace:g}s but {said} is {wait:g}s: on scancel, a time limit or a "
            "preemption Slurm SIGKILLs the nodes' mlaunch before the dying checkpoint is written; lower the grace "
            "period or raise KillWait (the --signal warning before the time limit is not affected)"
        )
    notes.append(
        f"every node must see {job.source} and checkpoint.dir ({job.resolve(job.checkpoint.dir)}) at the same "
        "path (shared storage), and run the same mlaunch"
    )
    return notes


def default_output(job: Job) -> Path:
    return job.code_path / SBATCH_NAME
