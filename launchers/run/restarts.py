"""The restart loop: attempt after attempt, the same for a fixed job and an elastic one.

One loop (as torch.distributed.elastic's ``_invoke_run``): run an attempt; success or a stop ends
the run with its exit code; otherwise the nodes gather for the next attempt, and the *membership
policy* says how:

- ``FixedMembership`` (every job without an elastic range): the nodes count each other at the
  restart (``start/<attempt>``) after the backoff; a lost node ends the job;
- ``ElasticMembership`` (``pytorch.nnodes: "MIN:MAX"``, ``run/membership.py``): the members meet
  first; the meeting says who left, who is admitted and the job's restart count, and the next
  generation runs at the size it says.

An attempt ended by a membership change (``Outcome.status == "reformed"``, or a meeting that
says a node left or node 0 regrouped) is not a failure: it does not count against
``restart.max_restarts`` and waits no backoff. A failure does; giving up, the backoff (with
a stop signal while waiting) and not retrying a failure that repeats itself exactly
(``retry_policy``) exist here once, for both policies. A stop signal to mlaunch ends the run
whenever it comes: during an attempt (``Outcome.status == "signalled"``, even if a re-form was
under way), while the ranks stop after a failure (the failure's outcome carries the signal: no
restart), or during the backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from launchers import stop_signals as early_signals
from launchers.log import say
from launchers.outcome import Outcome, signal_name
from launchers.phases import long_phase
from launchers.planning import plan_attempt
from launchers.run.job_wide import job_exit_code, meet_before_restart
from launchers.run.retry_policy import (
    FailureRecord,
    made_progress,
    record_of,
    repeated,
    restart_delay,
    streak_after,
)

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.control import JobEvents
    from launchers.engines.base import Engine
    from launchers.plan import LaunchPlan
    from launchers.platform.cluster import Cluster
    from launchers.run.attempt import RunContext

Attempt = Callable[["LaunchPlan", int, Callable[[], None]], tuple[Outcome, set[str]]]  # plan, attempt, extra tick
Ended = Callable[[Outcome, "LaunchPlan", set[str]], "int | None"]  # success or a stop: the exit code; else None


@dataclass(frozen=True)
class Generation:
    """The next attempt to run: its plan and number."""

    plan: LaunchPlan
    attempt: int


@dataclass(frozen=True)
class Gathered:
    """The nodes gathered after an attempt: whether the membership changed, and the job's restarts so far."""

    reformed: bool
    restarts: int
    detail: object = None  # the policy's own record of the gathering (an elastic job's ``Meeting``)


class MembershipPolicy(Protocol):
    """How the nodes gather between attempts (see the module docstring)."""

    def start(self) -> Generation | int: ...
    def tick(self) -> None: ...
    def attempt_ended(self) -> None: ...
    def gather(self, attempt: int, code: int) -> Gathered | int: ...
    def form(self, attempt: int, gathered: Gathered, code: int) -> Generation | int: ...


class RestartLoop:
    """Attempts per ``restart:`` (``max_restarts``, ``backoff``, ``max_backoff``), gathering per the policy."""

    def __init__(self, job: Job, run: RunContext, policy: MembershipPolicy, attempt: Attempt, ended: Ended) -> None:
        self.job, self.run, self.policy = job, run, policy
        self._attempt, self._ended = attempt, ended
        self._last_failure: FailureRecord | None = None  # the previous failed attempt (``retry_policy``)
        self._streak = 0  # failed attempts in a row that trained nothing (``retry_policy.restart_delay``)

    def run_all(self) -> int:
        """The exit code mlaunch exits with."""
        generation = self.policy.start()
        while not isinstance(generation, int):
            outcome, roots = self._attempt(generation.plan, generation.attempt, self.policy.tick)
            self.policy.attempt_ended()
            code = self._ended(outcome, generation.plan, roots)
            if code is not None:
                return code
            code = 1
            if outcome.status != "failed":
                self._streak = 0
                self._last_failure = None  # "twice in a row": a re-formed attempt between them breaks the streak
            else:
                code, over = job_exit_code(self.run.events, generation.attempt, outcome)
                self._streak = streak_after(self._streak, self._progressed(), self._first_cause(generation.attempt))
                if over or self._repeats(outcome):
                    return code
                if outcome.signal is not None:  # stopped while the failure stopped the ranks: no restart
                    say(f"received {signal_name(outcome.signal)} while stopping after the failure; not restarting")
                    return 128 + outcome.signal
            following = generation.attempt + 1
            gathered = self.policy.gather(following, code)
            if isinstance(gathered, int):
                return gathered
            if not gathered.reformed:
                refused = self._restart_allowed(gathered.restarts, following, code)
                if refused is not None:
                    return refused
            generation = self.policy.form(following, gathered, code)
        return generation

    def _repeats(self, outcome: Outcome) -> bool:
        """The attempt failed exactly as the one before (``retry_policy``): stop, saying why."""
        if outcome.failure is None:
            return False
        attempts = self.run.observer.clock.attempts
        current = record_of(outcome.failure, attempts[-1].last_step if attempts else None)
        previous, self._last_failure = self._last_failure, current
        why = repeated(previous, current) if self.job.restart.stop_on_repeat else None
        if why is not None:
            say(f"not restarting: {why} — a restart would fail the same way (restart.stop_on_repeat: false retries)")
        return why is not None

    def _first_cause(self, attempt: int) -> str:
        """The cause of the job's first failure in ``attempt`` (heard by ``job_exit_code``), "" where none was said."""
        first = self.run.events.first_failure(attempt)
        return first.cause if first is not None else ""

    def _progressed(self) -> bool:
        """The attempt that just ended trained before it ended (``retry_policy.made_progress``)."""
        import time

        attempts = self.run.observer.clock.attempts
        if not attempts:
            return False
        current = attempts[-1]
        return made_progress(current.first_step, (current.ended or time.time()) - current.started)

    def _restart_allowed(self, restarts: int, attempt: int, code: int) -> int | None:
        """After a failure: give up when the restarts are spent, else back off per ``retry_policy`` (None: restart)."""
        policy = self.job.restart
        if restarts >= policy.max_restarts:
            if policy.max_restarts:
                say(f"giving up after {restarts} restart(s) (restart.max_restarts: {policy.max_restarts})")
            return code
        delay = restart_delay(policy.backoff, policy.max_backoff, self._streak)
        standbys = self.run.standbys
        warm = f" from {standbys.ready_count()} warm standbys" if standbys is not None else ""
        why = " (the attempt trained before it failed: no backoff)" if self._streak == 0 else ""
        if self._streak > 1:
            why = f" ({self._streak} failures in a row without a step: backoff doubled)"
        say(f"restarting the group ({restarts + 1}/{policy.max_restarts}) in {delay:g}s{warm}{why}")
        self.run.observer.restarting(attempt, delay)
        received = [s for s in self.run.signals.wait(delay) if s in early_signals.STOP_SIGNALS]
        if received:
            say(f"received {signal_name(received[0])} while waiting to restart; not restarting")
            return 128 + received[0]
        return None


class FixedMembership:
    """A job without an elastic range: the same nodes every attempt; they count each other before a restart."""

    def __init__(self, job: Job, engine: Engine[Cluster], cluster: Cluster, plan: LaunchPlan, run: RunContext) -> None:
        self.job, self.engine, self.cluster, self.plan, self.run = job, engine, cluster, plan, run

    def start(self) -> Generation | int:
        return Generation(self.plan, 0)

    def tick(self) -> None:
        return None

    def attempt_ended(self) -> None:
        return None

    def gather(self, attempt: int, code: int) -> Gathered:
        return Gathered(reformed=False, restarts=attempt - 1)  # they meet after the backoff (``form``)

    def form(self, attempt: int, gathered: Gathered, code: int) -> Generation | int:
        from launchers.control import node_timeout

        with long_phase("waiting for every node before the restart"):
            met = meet_before_restart(self.run.events, attempt, node_timeout(self.job) + 5)
        if not met:
            return code
        self.run.events.start_generation(attempt)
        refused = health_check(self.job, self.cluster, self.run.events, self.run)  # again before each restart
        if refused is not None:
            return refused
        self.cluster = self.engine.restart_cluster(self.cluster, attempt)
        return Generation(plan_attempt(self.engine, self.job, self.cluster, attempt), attempt)


def health_check(job: Job, cluster: Cluster, events: JobEvents, run: RunContext) -> int | None:
    """The node health check when job.yaml turns it on (``launchers.health``, imported only then)."""
    if not job.health_check.before_start:
        return None
    from launchers.health.gate import before_start

    return before_start(job, cluster, events, run.observer.health)
