"""Stopping a group of processes: the stop signal, the grace period, then SIGKILL.

The first failure, or a stop signal to mlaunch, sends SIGTERM (or that signal) to every
process group and starts the grace period; whatever is still alive at its end is SIGKILLed.
On a stop by signal ``reserve`` keeps the end of the grace period for the agent-side save
of what the workers staged; SIGINT twice kills at once; SIGUSR1/SIGUSR2 are forwarded as is.

After a failure the failure hook runs while the other workers are frozen with SIGSTOP (they
cannot overwrite the state it reads, nor take the CPU it needs); then they get SIGTERM and
SIGCONT — or SIGKILL when the hook says there is nothing left for them to save, or when none of
them has reached a step boundary yet (``unstarted``): a guarded rank saves only at the agreed stop
of a step boundary, an agreement the failed rank can no longer join, and what it would save is
the state it started from. After a peer's crash such a rank would otherwise sit out
``stop_timeout`` in its start-up (imports, a cold ``DistributedDataParallel``) or in a traceback's
interpreter teardown.

A graceful stop (a stop signal to mlaunch, a re-form) of ranks that have not reached a step
boundary yet gives them ``STARTUP_STOP`` seconds, not the grace period: their dying checkpoint
is saved at the first boundary all ranks agree on, which a rank stuck in start-up (waiting in
``init_process_group`` for a peer that already left) never reaches, and what they would save is
the state they started from. If one reaches a boundary within that time the whole grace period
applies again.

A stop caused by a failure (a rank crashed or hung) gives the others ``stop_timeout``
(``restart.stop_timeout``), not the whole grace period: after a peer's crash the survivors
cannot finish a collective, so a trainer whose SIGTERM handler waits in one would otherwise
hold the restart for the grace period. A stop by signal (a preemption) keeps the grace period.
The stop signal reaches every process group in one loop, with no wait between them; after a
failure they are frozen first, so the SIGTERM is pending in all of them when one SIGCONT loop
wakes them together.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from launchers.outcome import Failure, signal_name
from launchers.procs import signal_stop
from launchers.run.signal_router import FORWARD_SIGNALS
from launchers.run.streams import Worker

STOP_LIKE = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2}
STARTUP_STOP = 1.0  # seconds a graceful stop waits for ranks that have not reached a step boundary


class Teardown:
    """The stop state of one attempt and the grace clock (``kill_at``) the supervision loop honours."""

    def __init__(
        self,
        grace_period: float,
        live: Callable[[], list[Worker]],
        announce: Callable[[str], None],
        reserve: Callable[[], float] | None = None,
        *,
        stop_timeout: float | None = None,
        guarded: Callable[[], set[int]] | None = None,
        unstarted: Callable[[], set[int]] | None = None,
        keep: Callable[[Failure], list[Worker]] | None = None,
    ) -> None:
        self.grace_period = grace_period
        self.stop_timeout = stop_timeout
        self.guarded = guarded  # the pids that stop their own children (DataLoader workers)
        self.unstarted = unstarted  # guarded pids that have reached no step boundary yet
        self.keep = keep  # after a failure: the workers that recover in place (``run.in_place``), out of ``live``
        self.live = live
        self.announce = announce
        self.reserve = reserve
        self.signal: int | None = None  # the stop signal mlaunch received, if any
        self.stopping = False
        self.stop_started: float | None = None
        self.grace_expired = False
        self.kill_at: float | None = None
        self.kill_after = grace_period
        self.after_failure_stop = False  # the stop follows a failure: ``stop_timeout`` applies
        self.full_kill_at: float | None = None  # the grace period's end while a start-up stop is shorter

    def signal_groups(self, sig: int) -> None:
        """``sig`` to every live process's group (a stop signal spares what guarded ranks stop themselves)."""
        guarded = self.guarded() if self.guarded is not None and sig in STOP_LIKE else set()
        signal_stop([worker.pid for worker in self.live()], sig, guarded)

    def stop_all(self, sig: int, kill_after: float | None = None) -> None:
        """``sig`` to every group; SIGKILL after ``kill_after`` seconds (the grace period)."""
        if self.stop_started is None:
            self.stop_started = time.monotonic()
        self.stopping = True
        self.signal_groups(sig)
        if self.kill_at is None:
            self.kill_after = self.grace_period if kill_after is None else kill_after
            self.kill_at = time.monotonic() + self.kill_after
            if sig in STOP_LIKE and self.kill_after > STARTUP_STOP and self._nothing_started():
                self.full_kill_at, self.kill_at = self.kill_at, time.monotonic() + STARTUP_STOP

    def stop_unsavable(self, why: str, kill_after: float) -> None:
        """A stop in which no rank here can save: SIGKILL at once to ranks whose stop is only a save.

        After a node left or was lost mid-step the ranks here can neither finish a collective
        nor agree a stop step with its ranks, and what they staged is no step of the whole job.
        A guarded rank's SIGTERM only asks it to save at such a step (``launchers.elastic``), so
        it would sit out ``kill_after`` — a second or two of every such re-form, which a storm
        of faults pays dozens of times. When every live process is guarded they are SIGKILLed
        at once, and ``why`` says so; a process with its own SIGTERM handler keeps ``kill_after``.
        """
        live = self.live()
        guarded = self.guarded() if self.guarded is not None else set()
        if live and all(w.pid in guarded for w in live):
            self.announce(f"{why}; SIGKILL to " + ", ".join(w.label for w in live))
            self.signal_groups(signal.SIGKILL)
        self.stop_all(signal.SIGTERM, kill_after=kill_after)

    def timeout(self, longest: float) -> float:
        """How long the loop may wait: ``longest``, or less when the grace period ends sooner."""
        if self.kill_at is None:
            return longest
        return max(0.0, min(longest, self.kill_at - time.monotonic()))

    def enforce_grace(self) -> None:
        """SIGKILL whatever is still alive once the grace period is over."""
        if self.kill_at is None or time.monotonic() < self.kill_at:
            return
        live = self.live()
        if self.full_kill_at is not None:  # a start-up stop: still nobody at a step boundary?
            self.kill_at, self.full_kill_at = self.full_kill_at, None
            if live and not self._nothing_started():
                return  # one reached a boundary: it may be saving the dying checkpoint
            if live:
                self.announce(
                    f"no rank here has reached a step boundary {STARTUP_STOP:g}s into the stop "
                    "(nothing newer than where they started to save); SIGKILL to " + ", ".join(w.label for w in live)
                )
            self.signal_groups(signal.SIGKILL)
            self.kill_at = None
            return
        if live:
            self.grace_expired = True
            if self.after_failure_stop:
                what = f"stop timeout of {self.kill_after:g}s after the failure is over (restart.stop_timeout)"
            elif self.kill_after < self.grace_period:
                what = (
                    f"{self.kill_after:.3g}s of the {self.grace_period:g}s grace period are over "
                    "(the rest is kept for the agent-side save)"
                )
            else:
                what = f"grace period of {self.grace_period:g}s is over"
            self.announce(f"{what}; SIGKILL to " + ", ".join(w.label for w in live))
        self.signal_groups(signal.SIGKILL)
        self.kill_at = None

    def _nothing_started(self) -> bool:
        if self.unstarted is None:
            return False
        return nothing_started([w.pid for w in self.live()], self.unstarted()) is not None

    def on_signal(self, sig: int) -> None:
        """A signal to mlaunch: forward a notice; stop on the first stop signal; SIGINT twice kills."""
        if sig == signal.SIGCHLD:
            return
        if sig in FORWARD_SIGNALS:
            self.announce(f"forwarding {signal_name(sig)} to {len(self.live())} processes")
            self.signal_groups(sig)
            return
        if self.signal is None and not self.stopping:
            self.signal = sig
            reserve = self._agent_reserve()
            kept = f" ({reserve:.3g}s of the grace period kept for the agent-side save)" if reserve else ""
            self.stop_all(sig, kill_after=self.grace_period - reserve)
            kill_in = f"{self.grace_period - reserve:.3g}s{kept}"
            if self.full_kill_at is not None:  # the start-up stop (``STARTUP_STOP``)
                kill_in = (
                    f"{STARTUP_STOP:g}s: no rank here has reached a step boundary yet (the grace period of "
                    f"{kill_in} applies if one reaches one by then)"
                )
            self.announce(
                f"received {signal_name(sig)}; forwarding it to {len(self.live())} processes, SIGKILL in {kill_in}"
            )
        elif self.signal is None:
            self.signal = sig  # already stopping after a failure: keep the failure's exit code
        elif sig == signal.SIGINT and self.kill_at is not None:
            self.announce("second interrupt: SIGKILL now")
            self.signal_groups(signal.SIGKILL)
            self.kill_at = None
        else:
            self.announce(f"received {signal_name(sig)} again; already stopping (SIGINT twice kills at once)")

    def _agent_reserve(self) -> float:
        """Seconds at the end of the grace period kept for the agent-side save (0 when nothing is staged)."""
        if self.reserve is None:
            return 0.0
        try:
            return max(0.0, min(float(self.reserve()), self.grace_period / 2))
        except Exception as exc:  # noqa: BLE001 - an estimate must never block a stop
            self.announce(f"reserve estimate failed (ignored): {exc!r}")
            return 0.0

    def failure_kill_after(self) -> float:
        """Seconds from the SIGTERM of a failure-triggered stop to SIGKILL."""
        if self.stop_timeout is None:
            return self.grace_period
        return min(self.stop_timeout, self.grace_period)

    def after_failure(self, failure: Failure, hook: Callable[[Failure], str | None] | None) -> None:
        """Stop the others after ``failure``, running ``hook`` first while they are frozen (SIGSTOP).

        Workers that recover in place (``keep``) are frozen for the hook too, then woken, never stopped:
        the rest (a hung rank) is SIGKILLed and replaced.
        """
        kept = self.keep(failure) if self.keep is not None else []
        self.after_failure_stop = self.kill_at is None
        self.signal_groups(signal.SIGSTOP)
        signal_stop([w.pid for w in kept], signal.SIGSTOP, set())
        kill_now = None
        try:
            kill_now = hook(failure) if hook is not None else None
        except Exception as exc:  # noqa: BLE001 - the teardown goes on whatever the hook did
            self.announce(f"failure hook error (ignored): {exc!r}")
        finally:
            live = self.live()
            if kept:
                self._replace(live, kept)
            else:
                self._stop_after_failure(live, kill_now)

    def _stop_after_failure(self, live: list[Worker], kill_now: str | None) -> None:
        """The ordinary stop after a failure: SIGKILL when nothing is left to save, else SIGTERM, the stop timeout."""
        if not kill_now and self.unstarted is not None:
            kill_now = nothing_started([w.pid for w in live], self.unstarted())
        if kill_now and live:
            # The hook saved what these processes could have saved (the agent-side
            # flash save committed their newest step), or they have not reached a step
            # to save: waiting out the stop timeout would only delay the restart.
            self.announce(f"{kill_now}; SIGKILL to " + ", ".join(w.label for w in live))
            self.signal_groups(signal.SIGKILL)
        # frozen, signalled, woken: the SIGTERM lands in every process at once
        self.stop_all(signal.SIGTERM, kill_after=self.failure_kill_after())
        self.signal_groups(signal.SIGCONT)

    def _replace(self, live: list[Worker], kept: list[Worker]) -> None:
        """In-place recovery: what is left of the failed rank goes at once; the survivors are woken to rejoin."""
        if self.stop_started is None:
            self.stop_started = time.monotonic()
        self.stopping = True
        if live:
            self.announce("replacing " + ", ".join(w.label for w in live) + ": SIGKILL")
            self.signal_groups(signal.SIGKILL)
        signal_stop([w.pid for w in kept], signal.SIGCONT, set())


def nothing_started(live: list[int], unstarted: set[int]) -> str | None:
    """Why the survivors of a failure have nothing to save because none has begun a step; None if one has.

    ``unstarted`` is the guarded processes without a progress report (``progress.unstarted_pids``):
    a process that is not guarded may save in its own SIGTERM handler, so it keeps its stop timeout.
    """
    if live and all(pid in unstarted for pid in live):
        return "no rank here has reached a step boundary in this attempt (nothing newer than where it started)"
    return None
