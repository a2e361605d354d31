"""The job-wide sections of job.yaml: ``monitor:`` (what makes a node or a rank count as failed) and ``control:``."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema

from launchers.config.durations import DURATION_PATTERN, parse_duration
from launchers.config.fields import Duration, Section
from launchers.config.limits import MAX_DURATION

K = 3.0  # × the slowest step seen (hang_timeout: auto; launchers.observe.hang_limit decides with it)
FLOOR = 10.0  # seconds: the least an auto limit is
AUTO: Final = "auto"

CONTROL_PORT_OFFSET = 1000  # the control plane's default port: the master (rendezvous) port + this


DEFAULT_START_TIMEOUT = 1800.0  # seconds before a first report (and, with auto, in the first step) unless off


def _hang_timeout(value: Any) -> float | str | None:
    """``auto``, ``off`` (or null: no hang detection after the first step) or a duration."""
    if isinstance(value, str) and value.strip().lower() in (AUTO, "off"):
        return AUTO if value.strip().lower() == AUTO else None
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"expected auto, off or a duration: {exc}") from None


HangTimeout = Annotated[
    float | Literal["auto"] | None,
    BeforeValidator(_hang_timeout),
    WithJsonSchema(
        {
            "anyOf": [
                {"enum": [AUTO, "off", None]},
                {"type": "number", "minimum": 0, "maximum": MAX_DURATION},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
            "description": "auto (learned from the job's steps), off, or a duration such as 30s, 5m",
        }
    ),
]


class MonitorOptions(Section):
    """``monitor:`` — how mlaunch notices a node that stopped answering, or a rank that stopped making progress."""

    def first_report_within(self) -> float | None:
        """``start_timeout``, or its default: 30 minutes unless ``hang_timeout`` is off, else no limit."""
        if self.start_timeout is not None:
            return self.start_timeout
        return DEFAULT_START_TIMEOUT if self.hang_timeout is not None else None

    node_timeout: Duration = Field(
        30.0,
        description="a node whose mlaunch sends nothing for this long (killed, link down) is declared lost; "
        "the other nodes stop their ranks and exit non-zero (several real nodes only)",
    )
    join_timeout: Duration = Field(
        300.0,
        description="how long a node waits for node 0's control plane to answer the first time (the nodes of a job "
        "start at different times); after that it exits non-zero (several real nodes only)",
    )
    hang_timeout: HangTimeout = Field(
        AUTO,
        description="a rank that reported progress (launchers.elastic: guard.should_stop, ckpt.stage, heartbeat) "
        "and then none for this long is hung: every rank dumps its Python stacks to its log, then it is a failure "
        f"(flash save, restart or exit). auto (the default): max({K:g} × the slowest step the job has been seen to "
        f"take, checkpoint and evaluation steps included, {FLOOR:g}s), and a rank whose main thread still runs "
        "Python is busy, not hung, until start_timeout; a duration: that long, whatever the rank does; off: only "
        "start_timeout judges. Ranks that never report are not judged",
    )
    start_timeout: Duration | None = Field(
        None,
        description="a rank that uses launchers.elastic (installed the guard) but reports no progress this long "
        "after its attempt started is hung before its first step (a deadlock in start-up or in the first step's "
        "collectives), or in its first step (auto: from its first report to its next one) is hung: judged as a "
        "hang; default 30 minutes unless hang_timeout is off (the first step may compile and warm up for long), "
        "off then",
    )
    rejoin_timeout: HangTimeout = Field(
        AUTO,
        description="after a fault recovered in place (@elastic.recoverable), every rank of the re-formed group "
        "reports progress within this, or the recovery is stuck: every rank dumps its Python stacks to its log and "
        "the whole job restarts instead, said in the log and events.jsonl. auto (the default): twice the longest an "
        "earlier attempt took from its start to its ranks' first reports, at least 30s (not judged until the ranks "
        "were seen to report); a duration: that long; off: no bound",
    )
    straggler_factor: float | None = Field(
        None,
        gt=1.0,
        le=1000.0,
        description="a rank whose own time per step (less the time it waits for other ranks in launchers.elastic's "
        "waiting() and guard.should_stop, and saves) is at least this × the job's median for straggler_steps "
        "steps is reported (console, events.jsonl, mlaunch status), and again when it recovers; e.g. 1.5; "
        "off when unset",
    )
    straggler_steps: int = Field(
        5, ge=1, le=100000, description="consecutive steps beyond (or back under) the bound before a rank is reported"
    )


class ControlOptions(Section):
    """``control:`` — the job-wide control plane node 0's mlaunch hosts and every node's mlaunch joins."""

    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description=f"TCP port on the master address; default: the rendezvous (master) port + {CONTROL_PORT_OFFSET}",
    )
