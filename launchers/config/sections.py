"""The run sections of job.yaml: ``prestart:`` (what is installed first), ``checkpoint:`` and ``restart:``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from launchers.config.fields import Count, Duration, EnvValue, PathText, PositiveCount, Section, check_env_names
from launchers.config.secrets import looks_secret


class PrestartOptions(Section):
    """``prestart:`` — what the generated ma_pre_start.sh installs and exports."""

    dir: str | None = Field(
        None,
        description="directory the pre-start enters and installs from; relative to code_dir, or absolute "
        "(e.g. /home/ma-user/modelarts/inputs/data_url_0); default: code_dir",
    )
    wheels: list[str] = Field(
        default_factory=list,
        description="wheel files or globs (e.g. dist/mlaunch-*.whl), relative to prestart.dir; installed in order",
    )
    requirements: str | None = Field(None, description="requirements file for pip install -r, relative to prestart.dir")
    commands: list[str] = Field(
        default_factory=list, description="extra shell commands, run after the installs (each by bash -c)"
    )
    env: dict[str, EnvValue] = Field(
        default_factory=dict, description="exported, and persisted for the start file; no secrets here"
    )
    passthrough: list[str] = Field(
        default_factory=list,
        description="env names (secrets: *_KEY, *TOKEN*...) passed on from the platform env, never written or echoed",
    )
    cleanup: bool = Field(False, description="remove the wheel files it installed from prestart.dir afterwards")
    offline: bool = Field(False, description="pip --no-index: install only from the wheels and find_links")
    find_links: list[str] = Field(
        default_factory=list, description="directories of wheels for pip --find-links, relative to prestart.dir"
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        check_env_names(value)
        secrets = [name for name in value if looks_secret(name)]
        if secrets:
            raise ValueError(
                f"{', '.join(secrets)} looks like a secret; mlaunch never writes secrets into generated scripts. "
                "Set it in the platform's job environment and list its name under prestart.passthrough"
            )
        return value

    @field_validator("passthrough")
    @classmethod
    def _passthrough_names(cls, value: list[str]) -> list[str]:
        check_env_names(dict.fromkeys(value, ""))
        return value


class CheckpointOptions(Section):
    """``checkpoint:`` — where dying checkpoints go and how long a save may take."""

    dir: PathText = "output/ckpt"
    grace_period: Duration = Field(30.0, description="SIGTERM → SIGKILL budget for workers to save and exit")
    keep: PositiveCount = Field(3, description="committed checkpoints to keep; 1..1000000")
    step_time: Duration | None = Field(None, description="declared time of one training step (grace budget)")
    save_time: Duration | None = Field(None, description="declared time of one save (grace budget)")
    persist_every: PositiveCount | None = Field(
        None,
        description="mlaunch writes every N-th step the ranks stage (Checkpointer.stage) to dir in the background "
        "and commits it, so periodic checkpoints cost the training loop only the memory copy; default: off",
    )
    on_unreadable: Literal["fail", "start_over"] = Field(
        "fail",
        description="committed checkpoints exist but none can be loaded: fail (every rank raises CheckpointError "
        "with the reason per step) or start_over (train from scratch with a warning, an event and a status flag)",
    )
    replicate: Literal["auto", "peer", "off"] = Field(
        "auto",
        description="an elastic job's answer to a lost machine: the survivors commit the newest step staged "
        "(Checkpointer.stage) instead of falling back to the last commit. auto: replicated state (DDP) needs no "
        "copy, a node whose staged state is sharded (DTensor slices: FSDP2, TP) streams its newest slot to the "
        "next node's memory; peer: always stream; off: neither (a node loss resumes from the last commit)",
    )


class RestartOptions(Section):
    """``restart:`` — how often a failed group is started again."""

    max_restarts: Count = Field(0, description="0..1000000")
    backoff: Duration = Field(
        1.0,
        description="wait before restarting after a failure that trained nothing (no step in the attempt); doubles "
        "with each such failure in a row; a failure after progress restarts at once and resets it",
    )
    max_backoff: Duration = Field(60.0)
    stop_timeout: Duration = Field(
        3.0,
        description="after a rank fails (crash, hang), SIGTERM → SIGKILL for the other ranks (capped by "
        "checkpoint.grace_period): survivors of a peer's crash cannot finish a collective, so they must not hold "
        "the restart for the whole grace period; a stop by signal (preemption) keeps the grace period",
    )
    stop_on_repeat: bool = Field(
        True,
        description="stop restarting when two attempts in a row fail the same way (the same exception at the same "
        "place, both before their first step or both at the same step): a deterministic error is not retried "
        "blindly; false restarts anyway",
    )
