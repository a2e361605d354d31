"""A bound on in-place recovery: the re-formed group reports progress in time, or the whole job restarts.

After a fault recovered in place (``run.in_place``) the survivors call their training function again
and the replacement starts from a standby; the group forms when the last of them arrives. Nothing
before this module bounded that wait: a survivor stuck on its way back (a rendezvous that never
completes, a rebuild that blocks) made no progress report *of the new attempt* — the hang monitor
judges only ranks that reported in it — so the job sat until ``monitor.start_timeout`` (30 minutes),
or for ever with ``hang_timeout: off``. A benchmark run saw it once in some hundred kills, with no
error anywhere. Issue 44 asks for the fallback: in-place recovery that cannot complete within a
bound ends in today's whole-job restart, said in the log and ``events.jsonl``.

The bound (``monitor.rejoin_timeout``): ``auto`` (the default) is twice the longest any earlier
attempt of the run took from its start to its last rank's first progress report — a re-formed
group does at most what a fresh start does, without the imports — and never under ``FLOOR``
seconds; a duration sets it; ``off`` removes it. It is armed only in an attempt that adopted
survivors, and under ``auto`` only once the ranks were seen to report (a script that never reports
progress through ``launchers.elastic`` is never judged by it). When it passes, every process writes
its stacks to its log (what kept the group from forming), and the failure's cause starts with
``STALLED``: ``in_place.keep_decision`` then keeps no rank in place, on this node and on every node
that hears of the failure, and the job restarts whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from launchers.elastic.ipc import progress
from launchers.run.streams import Worker

FLOOR: Final = 30.0  # seconds: the least ``auto`` allows a re-formed group
FACTOR: Final = 2.0  # × the longest start-to-first-reports an attempt of the run took
POLL: Final = 0.25  # seconds between two reads of the progress files in an attempt that adopted survivors
LEARN_POLL: Final = 1.0  # … in any other attempt, which only learns how long its ranks take to report
LEARN_FOR: Final = 1800.0  # seconds an attempt learns (``monitor.start_timeout``'s default): then it stops reading
STALLED: Final = "did not rejoin"  # the start of the failure's cause (``in_place.keep_decision`` reads it)


@dataclass
class FirstReports:
    """The longest an attempt of the run took from its start until every rank had reported once (one per run)."""

    longest: float | None = None

    def learn(self, seconds: float) -> None:
        self.longest = seconds if self.longest is None else max(self.longest, seconds)


_runs: dict[str, FirstReports] = {}


def first_reports(run_id: str) -> FirstReports:
    return _runs.setdefault(run_id, FirstReports())


def rejoin_limit(setting: float | str | None, longest: float | None) -> float | None:
    """The bound for a re-formed group (pure): ``setting`` as job.yaml says it, ``longest`` as the run learned it.

    None: not judged (``off``, or ``auto`` before any attempt's ranks all reported).
    """
    if setting is None:
        return None
    if isinstance(setting, int | float):
        return float(setting)
    return max(FLOOR, FACTOR * longest) if longest is not None else None


@dataclass(frozen=True)
class Stalled:
    """The re-formed group's ranks that had not reported when the bound passed."""

    waiting: list[Worker]
    limit: float


class RejoinWatch:
    """One attempt's watch: learns how long its ranks took to report; judges an in-place attempt that takes too long."""

    def __init__(self, run_id: str, attempt: int, setting: float | str | None) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.setting = setting
        self.learned = first_reports(run_id)
        self.started = time.monotonic()
        self.started_wall = time.time()  # the reports' first steps carry wall time
        self.done = False  # every rank reported, or the verdict was given
        self._next = 0.0

    def settle(self, reports: list[progress.Progress], live_pids: set[int]) -> None:
        """The attempt failed: learn what its ranks' ``reports`` show before its workers leave the watch.

        Why: ``poll`` looks once a second, and a fault soon after the first steps came before any look saw
        every rank report. Nothing was learned, so ``auto`` never judged the next group re-formed in place
        (one stuck in gloo's full mesh waited for good, under CI load). Here the time comes from the reports'
        own first steps, not from when they were seen: a fault an hour in does not teach an hour."""
        firsts = {r.pid: r.first_wall for r in reports if r.attempt == self.attempt and r.count > 0}
        if self.done or not live_pids or not live_pids <= firsts.keys():
            return
        if all(firsts[pid] > 0 for pid in live_pids):
            self.done = True
            self.learned.learn(max(0.0, max(firsts[pid] for pid in live_pids) - self.started_wall))

    def poll(self, workers: list[Worker], in_place: bool, now: float | None = None) -> Stalled | None:
        """``workers`` without a report of this attempt once the bound passed (None: nothing to do now)."""
        now = time.monotonic() if now is None else now
        if self.done or now < self._next or not workers:
            return None
        self._next = now + (POLL if in_place else LEARN_POLL)
        reported = {r.pid for r in progress.read_run(self.run_id) if r.attempt == self.attempt and r.count > 0}
        waiting = [w for w in workers if w.pid not in reported and w.spec.required]
        elapsed = now - self.started
        if not waiting:
            self.done = True
            self.learned.learn(elapsed)
            return None
        limit = rejoin_limit(self.setting, self.learned.longest) if in_place else None
        if limit is None and elapsed >= LEARN_FOR:
            self.done = True  # ranks that never report (a script without launchers.elastic's progress reports)
        if limit is None or elapsed < limit:
            return None
        self.done = True
        return Stalled(waiting, limit)
