"""``elastic:`` — what an elastic node range does when mlaunch itself supervises the ranks (issue 27).

The range is ``pytorch.nnodes: "MIN:MAX"``. With ``pytorch.style: torchrun`` torchrun's own agent
runs it (mlaunch hands it over); with the other styles mlaunch keeps the job going at another
size: a lost node is left out while at least MIN remain, a node that (re)joins is admitted up
to MAX (``launchers.run.membership``, docs/elastic-membership.md).
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import Field

from launchers.config.engine_sections import PytorchOptions
from launchers.config.fields import Duration, Section

LAST_CALL = 30.0  # elastic.last_call's default, seconds (torchrun's last call); the hub's default too


class WithPytorch(Protocol):
    """A job (``config.model.Job``, which imports this module: named by what is read of it)."""

    @property
    def pytorch(self) -> PytorchOptions: ...


class ElasticOptions(Section):
    """``elastic:`` — when a node that joins a running job is admitted (with ``pytorch.nnodes: "MIN:MAX"``)."""

    grow: Literal["at_restart", "at_checkpoint"] = Field(
        "at_restart",
        description="a node that joins a running job (its pod restarted, a new node) waits without ranks until: "
        "at_restart = the job's next restart (a failure or a node leaving); at_checkpoint = the next checkpoint "
        "committed after it arrived, then every node stops its ranks gracefully (SIGTERM, the grace period, "
        "their dying save) and all restart with it; never beyond pytorch.nnodes' MAX",
    )
    last_call: Duration = Field(
        LAST_CALL,
        description="at the job's first start, once MIN nodes are there: how long to wait for the others before "
        "starting without them (torchrun's last call); a node that never joined is left out and is admitted "
        "like any node that joins later. Without a range every node is waited for (monitor.join_timeout)",
    )


def node_range(job: WithPytorch) -> tuple[int, int] | None:
    """``(MIN, MAX)`` of job.yaml's elastic node range when mlaunch runs it; None without one or for torchrun.

    ``pytorch.nnodes`` was validated when loading: digits, ``1 ≤ MIN ≤ MAX``.
    """
    spec = job.pytorch.nnodes
    if not spec or ":" not in spec or job.pytorch.style == "torchrun":
        return None
    low, high = spec.split(":", 1)
    return int(low), int(high)
