"""Per-rank progress as mlaunch samples it: step, steps/s, own time per step, committed checkpoint.

The ranks' progress files hold only their newest report (``launchers.elastic.ipc.progress``);
mlaunch reads them twice a second. Between two samples a rank advanced ``Δstep`` steps in
``Δwall`` seconds, of which ``Δwaited`` it spent waiting for other ranks and ``Δsaving``
blocked by checkpoint saves: its *own* time per step is ``(Δwall − Δwaited − Δsaving) / Δstep``.
That is what straggler detection compares: in lock-step training every rank's interval is
the slowest rank's, but only the slowest rank's own time is long.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from launchers.elastic.ipc import progress

WINDOW = 8  # samples kept per rank for the rate


@dataclass
class RankProgress:
    """One rank of the current attempt, as the samples show it."""

    rank: int
    node: int
    host: str
    step: int = -1
    first_step: int = -1
    first_wall: float = 0.0
    last_wall: float = 0.0  # wall time of its newest report
    committed_step: int = -1
    saving: float = 0.0  # seconds saves blocked it, this attempt
    in_collective: bool = False  # inside ``elastic.waiting()`` at the newest sample (blocked on other ranks)
    frame: str | None = None  # innermost frame of its stack when a hang outside any collective was declared
    started_over: int = -1  # it trains from scratch although this step is committed (checkpoint.on_unreadable)
    own_step_time: float | None = None  # newest own time per step
    step_time: float | None = None  # newest interval per step
    samples: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    _last: progress.Progress | None = None

    @property
    def steps_per_s(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (s0, w0), (s1, w1) = self.samples[0], self.samples[-1]
        if w1 <= w0:
            return None
        return max(s1 - s0, 0) / (w1 - w0)

    def update(self, report: progress.Progress) -> int:
        """Take a new sample; the steps it advanced (0: nothing new)."""
        last = self._last
        self.step, self.last_wall = report.step, report.wall
        self.in_collective = report.in_collective
        self.committed_step = max(self.committed_step, report.committed_step)
        self.saving = report.saving
        if report.first_step >= 0 and self.first_step < 0:
            self.first_step, self.first_wall = report.first_step, report.first_wall
        if last is not None and report.count == last.count:
            return 0
        self._last = report
        if report.step >= 0:
            self.samples.append((report.step, report.wall))
        if last is None or report.step <= last.step or last.step < 0:
            return 0
        steps = report.step - last.step
        interval = report.wall - last.wall
        own = interval - (report.waited - last.waited) - (report.saving - last.saving)
        self.step_time = interval / steps
        self.own_step_time = max(own, 0.0) / steps
        return steps


class StepTracker:
    """Every rank of this node's mlaunch (all nodes in a simulation), sampled from their progress files."""

    def __init__(self, run_id: str, attempt: int, rank_nodes: dict[int, tuple[int, str]]) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.ranks = {rank: RankProgress(rank, node, host) for rank, (node, host) in rank_nodes.items()}
        self.advanced: dict[int, int] = {}  # rank → steps advanced in the newest sample

    def sample(self) -> dict[int, int]:
        """Read every progress file of the attempt; rank → steps it advanced since the last sample."""
        advanced: dict[int, int] = {}
        for report in progress.read_run(self.run_id):
            state = self.ranks.get(report.rank)
            if report.attempt != self.attempt or state is None:
                continue
            state.started_over = max(state.started_over, report.started_over)  # said before its first step
            if report.count == 0:
                continue
            steps = state.update(report)
            if steps:
                advanced[report.rank] = steps
        self.advanced = advanced
        return advanced

    def reported(self) -> list[RankProgress]:
        return [r for r in self.ranks.values() if r.step >= 0 or r.first_step >= 0]
