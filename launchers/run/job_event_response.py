"""How this node's supervisor answers what happens elsewhere in the job, and a stop signal to mlaunch.

Another node's first failure stops this node's ranks too (flash save first); a lost node stops
them at once; node 0's end stops them with its code; an elastic job's membership change ends the
attempt *re-formed* (``Outcome.status``), gracefully or not; the first stop signal to this
mlaunch tells the job that this node is leaving. Kept apart from the supervision loop
(``supervisor``), which calls these from its one thread.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from launchers.outcome import Failure, remote_failure, signal_name
from launchers.plan import FOLLOWER_ROLES
from launchers.run.streams import Worker
from launchers.run.teardown import Teardown
from launchers.stop_signals import STOP_SIGNALS

if TYPE_CHECKING:
    from launchers.control import JobEnded, JobEvents, Left, Regroup


NOTHING_TO_SAVE = "the ranks here can save nothing without that node's ranks (every one of them stops only to save)"


class JobEventResponse:
    """The supervisor's answers to job-wide events (a mixin of ``Supervisor``: it owns these fields)."""

    teardown: Teardown
    job_events: JobEvents | None
    announce: Callable[[str], None]
    on_failure: Callable[[Failure], str | None] | None
    _failure: Failure | None
    _change: str

    def _live(self) -> list[Worker]:
        raise NotImplementedError

    def dump_stacks(self) -> None:
        raise NotImplementedError

    def _on_signal(self, sig: int) -> None:
        """A signal to mlaunch (``teardown``); the first stop signal also tells the job this node is leaving.

        An elastic job's other nodes then stop gracefully with it (its ranks write the dying
        checkpoint with theirs) and re-form without waiting for it; other jobs ignore the word.
        """
        first = self.teardown.signal is None and sig in STOP_SIGNALS
        self.teardown.on_signal(sig)
        if first and self.job_events is not None:
            self.job_events.leave(f"its mlaunch was stopped by {signal_name(sig)} (a preemption)")

    def _job_event(self) -> None:
        """Another node's first failure stops this node's ranks too (flash save first); a lost node stops them now."""
        if self.job_events is None:
            return
        from launchers.control import JobEnded, Left, Lost, Regroup

        event = self.job_events.poll()
        if event is None or self.teardown.stopping:
            return
        live = self._live()
        if isinstance(event, JobEnded):
            self._job_ended(event, live)
            return
        if isinstance(event, (Left, Regroup)):
            self._membership_changed(event, live)
            return
        if isinstance(event, Lost):
            # No flash save: what the remaining ranks staged is not one consistent step of the job.
            self._failure = Failure(f"node {event.node}", -1, 0, 1, None, [event.describe()], None)
            self.announce(f"{event.describe()}; stopping the {len(live)} processes here")
            self.teardown.stop_unsavable(NOTHING_TO_SAVE, kill_after=min(self.teardown.grace_period, 2.0))
            return
        self._failure = remote_failure(event)
        self.announce(f"job-wide failure: {event.describe()}; stopping the {len(live)} processes here")
        if event.hung:  # every rank of the job writes its stacks, not only the hung rank's node
            self.announce(f"{event.cause}; writing every process's stacks to its log")
            self.dump_stacks()
        self.teardown.after_failure(self._failure, self.on_failure)

    def _membership_changed(self, event: Left | Regroup, live: list[Worker]) -> None:
        """An elastic job re-forms: a node left (stop now: no save can include its ranks), or node 0 regroups.

        A node that left takes its ranks' shards with it: the ranks here cannot finish a collective or
        commit a step, so guarded ranks are SIGKILLed at once, others get SIGTERM and, a second later,
        SIGKILL (``Teardown.stop_unsavable``; no flash save: a step staged by only some ranks must
        never be committed). A regroup (a node waits to join), and a node that
        left gracefully (its mlaunch was stopped: its ranks agreed with ours to stop and save), is a
        graceful stop: SIGTERM and the grace period, in which the ranks write their dying checkpoint.
        """
        from launchers.control import Left

        self._change = event.describe()
        if isinstance(event, Left) and not event.graceful:
            self.announce(f"{event.describe()}; stopping the {len(live)} processes here: the job re-forms without it")
            self.teardown.stop_unsavable(NOTHING_TO_SAVE, kill_after=min(self.teardown.grace_period, 1.0))
            return
        self.announce(f"{event.describe()}; stopping the {len(live)} processes here gracefully (SIGTERM)")
        self.teardown.stop_all(signal.SIGTERM)

    def _job_ended(self, event: JobEnded, live: list[Worker]) -> None:
        """Node 0 ended the job: followers stop with its code; other ranks stop unless it succeeded."""
        followers = all(w.spec.role in FOLLOWER_ROLES for w in live)
        if event.exit_code == 0 and not followers:
            return  # node 0's ranks are done; this node's finish on their own
        if event.exit_code != 0:
            self._failure = Failure(f"node {event.node}", -1, 0, event.exit_code, None, [event.describe()], None)
        self.announce(f"{event.describe()}; stopping the {len(live)} processes here")
        self.teardown.stop_all(signal.SIGTERM, kill_after=min(self.teardown.grace_period, 2.0) if followers else None)
