"""Stop signals that arrive while mlaunch is still starting up.

As a container's PID 1, mlaunch gets no default signal actions: the kernel drops a SIGTERM
sent before a handler exists. A platform that stops a job right after starting it (a
preemption, a user's cancel) would then be ignored until its kill timer fires. So the
console entry point installs these recorders first thing; the supervisor's
``SignalRouter`` takes over whatever they recorded, and a stop that comes before anything
was launched ends the run there, with 128 + the signal's number and nothing started.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_received: list[int] = []
_installed = False


def _record(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def install() -> None:
    """Record stop signals from now on instead of dying (or being ignored, as PID 1)."""
    global _installed
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)
    _installed = True


def uninstall() -> None:
    """Back to the default actions (commands other than ``run``); re-deliver what was recorded."""
    global _installed
    if not _installed:
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    _installed = False
    for number in take():
        signal.raise_signal(number)


def take() -> list[int]:
    """The signals recorded so far, oldest first; the record is emptied."""
    got = list(_received)
    del _received[: len(got)]
    return got


def first_stop() -> int | None:
    """The first stop signal recorded (without taking it), or None."""
    return _received[0] if _received else None
