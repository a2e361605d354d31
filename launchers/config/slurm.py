"""The ``slurm:`` section of job.yaml (read by ``mlaunch sbatch``).

Values that become ``#SBATCH`` lines are checked here, because sbatch reads those lines
itself (not a shell): a name with a blank or a line break would silently become another option.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from launchers.config.fields import CommandText, Count, Duration, Section
from launchers.config.limits import MAX_PROCS_PER_NODE

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=\S+)?")


class SlurmOptions(Section):
    """``slurm:`` — the allocation ``mlaunch sbatch`` asks for and what its script does when the job ends."""

    partition: str | None = Field(None, description="#SBATCH --partition")
    account: str | None = Field(None, description="#SBATCH --account")
    time: Duration | None = Field(
        None, description="#SBATCH --time, the job's time limit (e.g. 2h, 90m); default: the partition's"
    )
    cpus_per_task: int | None = Field(
        None, ge=1, le=65_536, description="#SBATCH --cpus-per-task: CPUs for each node's mlaunch and its processes"
    )
    gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=MAX_PROCS_PER_NODE,
        description="#SBATCH --gpus-per-node; on the nodes SLURM_GPUS_ON_NODE then sets the processes per node",
    )
    extra: list[str] = Field(
        default_factory=list,
        description="more #SBATCH options, one per item, e.g. --exclusive or --constraint=a100 (no blanks)",
    )
    srun_args: list[str] = Field(
        default_factory=list, description="more srun options for the step that runs mlaunch on every node"
    )
    mlaunch: CommandText = Field(
        "mlaunch", description="the mlaunch command on the nodes (a name on PATH or an absolute path)"
    )
    signal_before: Duration | None = Field(
        None,
        description="#SBATCH --signal=B:USR1@<this>: how long before the time limit the script asks every node's "
        "mlaunch to stop gracefully; default checkpoint.grace_period + 30s",
    )
    kill_wait: Duration | None = Field(
        None,
        description="the cluster's KillWait (SIGTERM → SIGKILL on scancel, time limit, preemption); default: what "
        "`scontrol show config` says when scontrol is here, else Slurm's default 30s; checked against the grace period",
    )
    requeue_exit_codes: list[int] = Field(
        default_factory=lambda: [143, 137],
        description="mlaunch exit codes after which the script requeues the job (scontrol requeue): 143 = stopped "
        "gracefully by a signal (time limit, preemption), 137 = a hung rank or a cut-off save",
    )
    max_requeues: Count = Field(3, description="requeue at most this many times (SLURM_RESTART_COUNT)")

    @field_validator("partition", "account")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm name: letters, digits and _ . + - only, at most 128")
        return value

    @field_validator("extra", "srun_args")
    @classmethod
    def _options(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _OPTION.fullmatch(item):
                raise ValueError(
                    f"{item!r} is not one option: expected --name or --name=value without blanks or quotes "
                    "(e.g. --exclusive, --constraint=a100)"
                )
        return value

    @field_validator("requeue_exit_codes")
    @classmethod
    def _codes(cls, value: list[int]) -> list[int]:
        bad = [code for code in value if not 1 <= code <= 255 or code == 2]
        if bad:
            raise ValueError(
                f"{bad}: exit codes are 1..255, and 2 (a mistake in job.yaml or the platform env) "
                "never succeeds on retry"
            )
        return value
