"""What the parts of a health check share: its outcome, the exit code, the rules from job.yaml, the local probes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launchers.health import probes
from launchers.health.verdict import Rules, Verdict

if TYPE_CHECKING:
    from launchers.config.job import Job

HEALTH_EXIT_CODE = 75  # EX_TEMPFAIL: a bad node; training did not start here (retry elsewhere)


@dataclass
class HealthOutcome:
    verdicts: list[Verdict]
    seconds: float
    incomplete: str | None = None  # why this node could not learn every node's result
    hosts: dict[int, str] = field(default_factory=dict)
    judged: int | None = None  # nodes judged, where ``verdicts`` holds only this node's and the bad ones
    unlisted_bad: int = 0  # bad nodes beyond those listed (a node other than 0 is told of the first MAX_BAD)

    @property
    def count(self) -> int:
        """How many nodes the verdicts cover (another node than 0 holds its own and the bad nodes' only)."""
        return self.judged if self.judged is not None else len(self.verdicts)

    @property
    def bad(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.bad]


def rules_of(job: Job) -> Rules:
    options = job.health_check
    return Rules(options.straggler_factor, options.memory_limit, options.min_free_gb)


def measure_local(job: Job, host: str) -> dict[str, Any]:
    """This node's own probes (no links)."""
    return {
        "host": host,
        "compute": probes.compute(),
        "memory": probes.memory(),
        "storage": probes.storage(job.resolve(job.checkpoint.dir)),
    }


def torch_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available())
