"""Where a run's wall time went: the goodput report printed at the end of every run.

From the attempts (start, first and last progress report, first and last step, end) and the
ranks' blocked-saving seconds:

- productive: time between the first and last step report of each attempt, less the steps that
  redo work an earlier attempt had done (resumed from an older checkpoint) and less checkpoint
  stalls;
- start-up: from an attempt's start to its first step report (imports, rendezvous, loading);
- restarts: from an attempt's end to the next one's start (teardown, backoff, meeting the nodes);
- recomputed: steps at or below the newest step an earlier attempt reached, × the attempt's step time;
- checkpoint stalls: seconds saves (``Checkpointer.save``/``stage``) blocked training;
- other: the rest (the end of each attempt after its last step: the failure or stop, the dying
  checkpoint, shutting down).

Beside the times, the newest committed step and how many commits each party made — the ranks'
own saves, mlaunch's flash save after a failure, its background persist — since a resume starts
from whichever was newest.

Goodput is productive ÷ wall. Ranks that never report progress (not using ``launchers.elastic``)
leave only the wall time to report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class AttemptTimes:
    attempt: int
    started: float  # wall time
    ended: float | None = None
    first_wall: float | None = None  # the first step report of any rank
    last_wall: float | None = None
    first_step: int | None = None
    last_step: int | None = None
    saving: float = 0.0  # the most any rank was blocked by saves
    regrouped: bool = False  # started by an elastic job's membership change (a node left or joined)
    committed_before: int | None = None  # the job's newest committed step when this attempt began

    def note(self, first_step: int, first_wall: float, step: int, last_wall: float, saving: float) -> None:
        """One rank's figures for this attempt (called again as they grow)."""
        if first_step >= 0:
            self.first_step = first_step if self.first_step is None else min(self.first_step, first_step)
            self.first_wall = first_wall if self.first_wall is None else min(self.first_wall, first_wall)
        if step >= 0:
            self.last_step = step if self.last_step is None else max(self.last_step, step)
            self.last_wall = last_wall if self.last_wall is None else max(self.last_wall, last_wall)
        self.saving = max(self.saving, saving)

    @property
    def stepping(self) -> float:
        if self.first_wall is None or self.last_wall is None:
            return 0.0
        return max(0.0, self.last_wall - self.first_wall)

    @property
    def step_time(self) -> float:
        if self.first_step is None or self.last_step is None or self.last_step <= self.first_step:
            return 0.0
        return self.stepping / (self.last_step - self.first_step)


@dataclass
class Goodput:
    started: float
    attempts: list[AttemptTimes] = field(default_factory=list)
    commits: dict[str, int] = field(default_factory=dict)  # who committed (ranks, flash, background) → how often
    committed_steps: list[int] = field(default_factory=list)  # each new newest committed step, in order
    committed_step: int | None = None
    committed_by: str | None = None
    _regroup_next: bool = False

    def membership_changed(self) -> None:
        """The next attempt starts at another membership (its time lost is the gap of steps around it)."""
        self._regroup_next = True

    def committed(self, step: int, source: str) -> None:
        """A new newest committed step, by ``source``."""
        self.commits[source] = self.commits.get(source, 0) + 1
        if self.committed_step is None or step >= self.committed_step:
            self.committed_step, self.committed_by = step, source
        if not self.committed_steps or step > self.committed_steps[-1]:
            self.committed_steps.append(step)

    def begin(self, attempt: int, now: float) -> AttemptTimes:
        times = AttemptTimes(attempt, now, regrouped=self._regroup_next, committed_before=self.committed_step)
        self._regroup_next = False
        self.attempts.append(times)
        return times

    def figures(self, ended: float) -> dict[str, Any]:
        """Every figure of the report, in seconds (rounded to ms) and counts."""
        wall = max(0.0, ended - self.started)
        stepping = sum(a.stepping for a in self.attempts)
        startup = sum((a.first_wall or a.ended or ended) - a.started for a in self.attempts)
        startup = max(0.0, startup) + (self.attempts[0].started - self.started if self.attempts else 0.0)
        downtime = sum(
            max(0.0, b.started - (a.ended or b.started)) for a, b in zip(self.attempts, self.attempts[1:], strict=False)
        )
        recomputed_steps, recomputed = self._recomputed()
        stalls = sum(a.saving for a in self.attempts)
        productive = max(0.0, stepping - recomputed - stalls)
        other = max(0.0, wall - productive - recomputed - stalls - startup - downtime)
        reported = any(a.first_wall is not None for a in self.attempts)
        return {
            "wall_s": round(wall, 3),
            "productive_s": round(productive, 3) if reported else None,
            "goodput": round(productive / wall, 4) if reported and wall > 0 else None,
            "startup_s": round(startup, 3) if reported else None,
            "restarts": max(0, len(self.attempts) - 1),
            "restart_downtime_s": round(downtime, 3),
            "recomputed_steps": recomputed_steps,
            "recomputed_s": round(recomputed, 3),
            "checkpoint_stall_s": round(stalls, 3),
            "other_s": round(other, 3) if reported else None,
            "steps": self._steps_done(),
            "committed_step": self.committed_step,
            "committed_by": self.committed_by,
            "commits": dict(self.commits),
            "recompute_warnings": recompute_warnings(self.attempts, self.committed_steps),
            **self._membership(),
        }

    def _membership(self) -> dict[str, Any]:
        """Membership changes, and the time from the last step before each to the first step after it."""
        changes = [(a, b) for a, b in zip(self.attempts, self.attempts[1:], strict=False) if b.regrouped]
        gaps = [b.first_wall - a.last_wall for a, b in changes if a.last_wall is not None and b.first_wall is not None]
        return {"membership_changes": len(changes), "membership_lost_s": round(sum(gaps), 3)}

    def _recomputed(self) -> tuple[int, float]:
        """Steps each attempt redid (at or below the newest step an earlier attempt reached), and their time."""
        steps, seconds, reached = 0, 0.0, None
        for a in self.attempts:
            if reached is not None and a.first_step is not None and a.last_step is not None:
                redone = max(0, min(a.last_step, reached) - a.first_step + 1)
                steps += redone
                seconds += redone * a.step_time
            if a.last_step is not None:
                reached = a.last_step if reached is None else max(reached, a.last_step)
        return steps, seconds

    def _steps_done(self) -> int | None:
        lasts = [a.last_step for a in self.attempts if a.last_step is not None]
        return max(lasts) if lasts else None


def commit_interval(steps: list[int]) -> int | None:
    """The job's usual distance between commits (the median gap), None with fewer than two commits."""
    gaps = sorted(b - a for a, b in zip(steps, steps[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else None


def recompute_warnings(attempts: list[AttemptTimes], committed_steps: list[int]) -> list[str]:
    """Attempts that redid more than the job should ever lose: why each did (pure: the report says them).

    An attempt that began at or below a step already committed did not resume from the newest
    commit (a fresh start, an unreadable step, a lineage gone wrong); one that redid more than one
    commit interval lost more than a checkpoint's worth of work (commits too far apart, or a
    resume from an older commit than the newest).
    """
    interval = commit_interval(committed_steps)
    warnings: list[str] = []
    reached: int | None = None
    for a in attempts:
        if reached is not None and a.first_step is not None:
            redone = max(0, reached - a.first_step + 1)
            committed = a.committed_before
            if committed is not None and a.first_step <= committed:
                begun = "from scratch" if a.first_step == 0 else f"at step {a.first_step}"
                warnings.append(
                    f"attempt {a.attempt} began {begun} although step {committed} was committed: it did not resume "
                    f"from the newest commit, and redid {redone} steps"
                )
            elif interval is not None and redone > interval:
                warnings.append(
                    f"attempt {a.attempt} resumed from step {a.first_step - 1} and redid {redone} steps, more than "
                    f"one commit interval ({interval} steps): the attempt before reached step {reached}"
                )
        if a.last_step is not None:
            reached = a.last_step if reached is None else max(reached, a.last_step)
    return warnings


_COMMITTERS = {"ranks": "the ranks' own save", "flash": "flash save", "background": "background persist"}


def describe(figures: dict[str, Any]) -> str:
    """The report, as one paragraph a person reads at the end of the run."""
    wall = figures["wall_s"]
    if figures["goodput"] is None:
        return (
            f"goodput: {wall:.1f}s wall time; no rank reported progress (launchers.elastic's guard.should_stop, "
            "ckpt.stage or elastic.heartbeat), so mlaunch cannot tell productive time from the rest"
        )
    parts = [
        f"productive steps {figures['productive_s']:.1f}s",
        f"start-up {figures['startup_s']:.1f}s",
        f"restarts {figures['restarts']} (down {figures['restart_downtime_s']:.1f}s)",
        f"recomputed {figures['recomputed_steps']} steps ({figures['recomputed_s']:.1f}s)",
        f"checkpoint stalls {figures['checkpoint_stall_s']:.1f}s",
        f"other {figures['other_s']:.1f}s",
    ]
    if figures.get("membership_changes"):
        parts.append(
            f"membership changes {figures['membership_changes']} ({figures['membership_lost_s']:.1f}s between the "
            "last step before and the first after)"
        )
    if figures.get("committed_step") is not None:
        by = _COMMITTERS.get(figures.get("committed_by") or "", "")
        parts.append(f"newest commit step {figures['committed_step']}" + (f" ({by})" if by else ""))
    return f"goodput: {figures['goodput'] * 100:.1f}% of {wall:.1f}s wall time — " + "; ".join(parts)
