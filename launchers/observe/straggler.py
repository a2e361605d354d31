"""Live straggler detection over every rank of the job (node 0's mlaunch, or the simulation's).

A rank is a straggler when its own time per step (``steps``: the step interval less the time
it waited for other ranks and was blocked saving) is at least ``factor`` × the job's median
own time per step, for ``steps`` consecutive steps; it is reported once, and again once it
stayed under that bound for as many steps (recovered). Fewer than 2 reporting ranks: nothing
to compare with.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class RankSample:
    """What the detector needs of one rank at one sample."""

    rank: int
    node: int
    host: str
    step: int
    own_step_time: float | None


@dataclass(frozen=True)
class StragglerChange:
    """A rank became a straggler (``slow``) or recovered."""

    rank: int
    node: int
    host: str
    slow: bool
    step: int
    step_time: float
    median: float

    def describe(self) -> str:
        ratio = self.step_time / self.median if self.median > 0 else float("inf")
        where = f"rank {self.rank} (node {self.node}, host {self.host or '?'})"
        figures = f"{self.step_time * 1000:.0f} ms of own time per step vs the job's median {self.median * 1000:.0f} ms"
        if self.slow:
            return f"straggler: {where} at step {self.step}: {figures} ({ratio:.1f}×)"
        return f"straggler recovered: {where} at step {self.step}: {figures} ({ratio:.1f}×)"


class StragglerDetector:
    def __init__(self, factor: float, steps: int) -> None:
        self.factor = factor
        self.steps = max(1, steps)
        self.slow: set[int] = set()
        self._seen: dict[int, int] = {}  # rank → step at its previous sample
        self._run: dict[int, int] = {}  # rank → consecutive steps on the other side of the bound

    def observe(self, samples: list[RankSample]) -> list[StragglerChange]:
        """Feed one sample of every rank; the changes it brings (new stragglers, recoveries)."""
        timed = [s for s in samples if s.own_step_time is not None and s.step >= 0]
        if len(timed) < 2:
            return []
        median = statistics.median(s.own_step_time for s in timed if s.own_step_time is not None)
        bound = self.factor * median
        changes = []
        for s in timed:
            assert s.own_step_time is not None
            advanced = s.step - self._seen.get(s.rank, s.step)
            self._seen[s.rank] = s.step
            if advanced <= 0:
                continue
            beyond = s.own_step_time >= bound and s.own_step_time > 0
            if beyond == (s.rank in self.slow):
                self._run[s.rank] = 0
                continue
            self._run[s.rank] = self._run.get(s.rank, 0) + advanced
            if self._run[s.rank] >= self.steps:
                self._run[s.rank] = 0
                if beyond:
                    self.slow.add(s.rank)
                else:
                    self.slow.discard(s.rank)
                changes.append(StragglerChange(s.rank, s.node, s.host, beyond, s.step, s.own_step_time, median))
        return changes

    def reset(self) -> None:
        """A new attempt: ranks start over (a restarted rank is not the straggler it was)."""
        self.slow.clear()
        self._seen.clear()
        self._run.clear()
