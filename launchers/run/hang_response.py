"""How this node's supervisor answers a rank that stopped making progress (``monitor.hang_timeout``).

Which ranks are hung, and for how long is too long, ``launchers.run.hang`` says (its limits:
``launchers.observe.hang_limit``); this module only acts on it.

While the ranks train, a hung rank is a failure like a crash: every process writes its stacks,
the job is told, and the others stop (flash save first). While they stop gracefully, a rank hung
since before the stop cannot reach the agreed step, so the stop does not wait for it. Kept apart
from the supervision loop (``supervisor``), which calls ``_check_hang`` from its one thread.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from launchers.outcome import Failure
from launchers.run.hang import HangMonitor
from launchers.run.streams import Worker
from launchers.run.teardown import Teardown

if TYPE_CHECKING:
    from launchers.control import JobEvents


class HangResponse:
    """The supervisor's answers to a hang (a mixin of ``Supervisor``: it owns these fields)."""

    hang: HangMonitor | None
    teardown: Teardown
    job_events: JobEvents | None
    announce: Callable[[str], None]
    on_failure: Callable[[Failure], str | None] | None
    _failure: Failure | None

    def _live(self) -> list[Worker]:
        raise NotImplementedError

    def dump_stacks(self) -> None:
        raise NotImplementedError

    def _check_hang(self) -> None:
        """Ranks without progress for their limit (``monitor.hang_timeout``): stacks, then a failure like any other."""
        if self.hang is None or self._failure is not None:
            return
        if self.teardown.stopping:
            self._check_hang_in_stop()
            return
        stale = self.hang.stale(self._live())
        if not stale:
            return
        self.announce(f"{self.hang.failure(stale).describe()}; writing every process's stacks to its log")
        marks = self.hang.log_marks(stale)  # where the stacks of the ranks outside a collective will start
        self.dump_stacks()
        self._failure = self.hang.failure(stale, marks)  # now with their innermost frames
        if self.hang.waits_for_another_node(stale):
            self._failure = None
            where = ", ".join(f"{s.worker.label} in {s.frame}" for s in stale)
            self.announce(f"every hung rank here waits for others ({where}): the culprit's node declares it; "
                          f"declared here if it has not within {self.hang.defer:g}s")  # fmt: skip
            return
        self.hang.declared(stale)
        for rank, why in (self._failure.details.get("stuck") or {}).items():
            self.announce(f"rank {rank}: {why}; the culprit, not a rank waiting for another")
        frames = self._failure.details.get("frames") or {}
        for rank, frame in frames.items():
            self.announce(f"rank {rank} is outside any collective wait; innermost frame: {frame}")
        if self.job_events is not None:
            self.job_events.report_failure(self._failure)  # a hang here is a failure of the whole job
        others = self._live()
        self.announce(f"stopping the {len(others)} processes after {self._failure.label} hung")
        self.teardown.after_failure(self._failure, self.on_failure)

    def _check_hang_in_stop(self) -> None:
        """A graceful stop whose ranks cannot reach the agreed step: one hung before it began.

        A stop (a preemption, a re-form) waits up to the grace period for every rank to reach
        the agreed step boundary and save. A rank that has reported no progress since before the
        stop began, for ``monitor.hang_timeout``, will not get there, and the others wait for it
        in a collective: the stop would sit out the grace period (a 300-fault storm: a hang, then
        a preemption 3 s later, 10 s of the grace period spent waiting). Every process is
        SIGKILLed now; what the ranks staged is committed by the agent-side save after the stop,
        as when the grace period runs out. A rank that reported after the stop began is saving,
        not hung, and is left alone.
        """
        assert self.hang is not None
        started = self.teardown.stop_started
        if started is None or self.teardown.after_failure_stop or self.teardown.kill_at is None:
            return
        stuck = [s for s in self.hang.stale(self._live()) if s.report.monotonic < started]
        if not stuck:
            return
        live = self._live()
        self.announce(
            f"{stuck[0].describe()} hung before the stop: no rank can reach the agreed step; SIGKILL to "
            + ", ".join(w.label for w in live)
            + " (the agent-side save commits what they staged)"
        )
        self.teardown.grace_expired = True
        self.teardown.signal_groups(signal.SIGKILL)
        self.teardown.kill_at = None
