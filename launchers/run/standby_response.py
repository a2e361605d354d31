"""The supervisor's part in warm standbys (a mixin of ``Supervisor``: it owns these fields).

Which standbys an attempt forks before its ranks start, and when the ones it used are refilled
(``launchers.standby.standby_pool.StandbyPool`` decides how; this says when, from the loop).
"""

from __future__ import annotations

from collections.abc import Callable

from launchers.plan import ProcessSpec
from launchers.run.streams import Worker
from launchers.run.teardown import Teardown
from launchers.standby.standby_pool import StandbyPool


class StandbyResponse:
    """Forking an attempt's ranks first, refilling the pool once they are past their start-up."""

    standbys: StandbyPool | None
    processes: list[ProcessSpec]
    workers: list[Worker]
    announce: Callable[[str], None]
    _parent_pid: int
    _started: float
    _standbys_announced: bool

    teardown: Teardown

    def _interrupted(self) -> bool:
        raise NotImplementedError

    def _fork_standbys_first(self, specs: list[ProcessSpec]) -> None:
        """This attempt's ranks forked from the warm parent rather than started cold (``StandbyPool.warm_start``)."""
        pool = self.standbys
        if pool is None or not specs:
            return
        try:
            pool.warm_start(specs, self._parent_pid, self._interrupted)
        except OSError as exc:  # standbys must never break supervision
            self.announce(f"cannot start standby workers: {exc}")
            self.standbys = None

    def _refill_standbys(self, now: float) -> None:
        """Warm standbys for the next attempt, once this one's workers are past their start-up."""
        pool = self.standbys
        if pool is None or self.teardown.stopping:
            return
        pool.maintain()  # the warm parent's news, and learning from the ranks' imports
        wanted = sum(1 for spec in self.processes if pool.compatible(spec))
        spoke = all(w.tail for w in self.workers) and len(self.workers) == len(self.processes)
        if pool.missing(self.processes) and pool.may_fill(now - self._started, spoke):
            try:
                pool.fill(self.processes, self._parent_pid)
            except OSError as exc:  # standbys must never break supervision
                self.announce(f"cannot start standby workers: {exc}")
                self.standbys = None
                return
        if not self._standbys_announced and wanted and pool.ready_count() >= wanted:
            self._standbys_announced = True
            self.announce(pool.ready_message(wanted))
