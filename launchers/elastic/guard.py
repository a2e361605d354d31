"""The stop flag: signals only set it; ranks agree on it at step boundaries.

Why a flag and not a save inside the handler: a save needs collectives (every rank writes,
then one commits), and a handler runs at an arbitrary point — possibly inside another
collective. So the handler does nothing but record the signal, and ``should_stop(step)`` —
called by every rank at the same points of the loop — turns the local flags into one
decision with a tiny all-reduce(MAX): if any rank was signalled, every rank stops at the
same step (Lightning's deadlock in #20806 was rank 0 deciding alone). A second signal is
ignored: the save already under way must not be started twice or interrupted.

``exit()`` ends the process with 143 (128 + SIGTERM), the code a supervisor and a
platform read as "stopped on request".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

from launchers.elastic.ipc import progress, rank_segment
from launchers.elastic.ranks import collective

EXIT_CODE = 143
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class GracefulExit(SystemExit):
    """Raised by ``Guard.exit()``: a ``SystemExit`` with code 143, so ``finally`` blocks still run."""

    def __init__(self, code: int = EXIT_CODE) -> None:
        super().__init__(code)


class Guard:
    """What ``install()`` returns: the flag, the agreement and the exit."""

    def __init__(self, signals: Iterable[int] = DEFAULT_SIGNALS, *, quiet: bool = False) -> None:
        self.signals = tuple(signals)
        self.quiet = quiet
        self.received: int | None = None  # the first signal
        self.count = 0  # every signal seen, the ignored ones included
        self.stop_step: int | None = None  # the step all ranks agreed to stop at
        self._previous: dict[int, Any] = {}
        self._installed = False
        self._last_check: float | None = None
        self._step_time = 0.0
        self._checks = 0
        self._status_at = 0.0

    # -- signals -----------------------------------------------------------------------
    def install(self) -> Guard:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("elastic.install() must run in the main thread (signal handlers live there)")
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        self._installed = True
        if signal.SIGTERM in self.signals:
            progress.mark_guarded()  # mlaunch's SIGTERM then comes here, not to our DataLoader workers
        return self

    def uninstall(self) -> None:
        """Put back the handlers that were there before ``install()``."""
        if not self._installed:
            return
        if signal.SIGTERM in self.signals:
            progress.mark_guarded(False)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self._installed = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.received is None:
            self.received = signum
            self._say(f"received {signal.Signals(signum).name}; will stop at the next step boundary")
        else:
            self._say(f"received {signal.Signals(signum).name} again; ignored (already stopping)")

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Set the flag from code (e.g. a time limit), as if ``signum`` had arrived."""
        self._handler(signum, None)

    @property
    def requested(self) -> bool:
        """This process's own flag (no agreement)."""
        return self.received is not None

    # -- agreement ---------------------------------------------------------------------
    def should_stop(self, step: int | None = None) -> bool:
        """True on every rank, at the same call, once any rank was signalled.

        Every rank must call it at the same points (each step, and inside long eval or
        warm-up loops). With ``torch.distributed`` (or MindSpore) initialised it is one
        all-reduce(MAX) of one integer; otherwise it is the local flag.
        """
        progress.report(step)
        self._measure_step()
        if self.stop_step is not None:
            return True
        coll = collective.current()
        local = 1 if self.received is not None else 0
        if coll.world_size() > 1:
            with progress.waiting():  # waiting for the slowest rank is not this rank's own time
                agreed = coll.all_reduce([local], "max")[0]
        else:
            agreed = local
        if agreed:
            self.stop_step = step if step is not None else -1
            if self.received is None:
                self._say(f"another rank was signalled; stopping at step {step}")
            return True
        return False

    def _measure_step(self) -> None:
        """Step time for mlaunch's grace-budget monitor (published at most once a second)."""
        now = time.monotonic()
        if self._last_check is not None:
            took = now - self._last_check
            self._step_time = took if self._checks < 2 else 0.8 * self._step_time + 0.2 * took
        self._last_check = now
        self._checks += 1
        if self._checks >= 3 and now - self._status_at > 1.0:
            self._status_at = now
            coll_rank, coll_world = _rank_world()
            rank_segment.update_status(coll_rank, coll_world, step_time=self._step_time, steps_seen=self._checks)

    # -- exit --------------------------------------------------------------------------
    def exit(self, code: int = EXIT_CODE) -> None:
        """Leave the training script with ``code`` (143): tear the process group down, then SystemExit.

        ``finally`` blocks and ``atexit`` handlers still run; the interpreter's own
        finalization is then skipped (``os._exit``), because torch's C++ teardown at exit
        occasionally aborts a process under load — a saved, committed job would report
        SIGABRT (134) instead of 143.
        """
        sys.stdout.flush()
        sys.stderr.flush()
        end_process_groups()
        _exit_after_atexit(code)
        raise GracefulExit(code)

    def _say(self, message: str) -> None:
        if self.quiet:
            return
        collective.say(message)  # safe inside a signal handler: launchers.log.say never raises


_KEPT_GROUPS: list[Any] = []  # the ended process groups, never destructed (see end_process_groups)


def end_process_groups() -> None:
    """``destroy_process_group``, but the group objects stay referenced until ``os._exit``.

    Dropping a gloo group's last reference joins its worker threads while holding the GIL. A worker
    that is still releasing a finished collective's Python tensors (``save_checkpoint``'s gather and
    barrier a moment earlier) needs the GIL to do so: a deadlock until the platform's SIGKILL. The
    last reference is often dropped by a framework's teardown on the way out (Lightning's
    ``strategy.teardown()`` unwrapping DDP). Held here, the group is never destructed: the process
    leaves through ``os._exit`` (``_exit_after_atexit``).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if not dist.is_initialized():
            return
        world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
        _KEPT_GROUPS.extend(list(getattr(world, "pg_map", None) or {}) or [dist.group.WORLD])
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway; a broken group must not change the code
        pass


def _exit_after_atexit(code: int) -> None:
    """At interpreter exit: run the other atexit handlers, flush, then ``os._exit(code)``."""

    def finish() -> None:
        atexit.unregister(finish)
        try:
            atexit._run_exitfuncs()  # the handlers registered before this one (loggers, ...)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    atexit.register(finish)  # registered last, so it runs first


def _rank_world() -> tuple[int, int]:
    coll = collective.current()
    return coll.rank(), coll.world_size()


_guard: Guard | None = None


def install(signals: Iterable[int] = DEFAULT_SIGNALS, *, quiet: bool = False) -> Guard:
    """Install the stop flag for ``signals`` (SIGTERM, SIGINT, SIGUSR1); idempotent per process."""
    global _guard
    if _guard is not None and _guard._installed:
        return _guard
    _guard = Guard(signals, quiet=quiet).install()
    return _guard
