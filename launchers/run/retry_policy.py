"""Is a restart worth it? A failure that repeats itself exactly is not retried blindly.

A deterministic script error (a typo, a wrong path, a shape mismatch at step 17) fails every
attempt the same way: each restart spends time and ``restart.max_restarts`` on a certainty. A
failure is *the same* when the attempt that just failed and the one before it failed with the
same exception at the same place (the exception line and the innermost frame of the failing
rank's traceback, as this node saw it in the rank's output), and

- both before their first step (nothing was trained: the start itself fails), or
- both at the same step (training reaches it and fails there every time).

Then the restarts stop, saying why (``restart.stop_on_repeat: false`` restarts anyway). A
failure with no traceback here (kill -9, OOM, a rank on another node), at another step, or of
another kind restarts as before.
The wait before a restart is decided here too (``restart_delay``): a backoff guards against a crash
loop, not against a fault. A failure that followed progress (a step trained in the attempt, or, for a
script that reports no steps, ``PROGRESS_UPTIME`` seconds of running) restarts at once; each failure
in a row *without* progress doubles the wait from ``restart.backoff`` up to ``restart.max_backoff``;
progress resets the streak (torchrun restarts at once every time; Kubernetes' CrashLoopBackOff grows
and is reset after 10 minutes of running).
Pure functions of what the restart loop observed: tested without processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launchers.outcome import Failure
from launchers.run.left_behind import LEFT_BEHIND

PROGRESS_UPTIME = 60.0  # seconds: an attempt of a script that reports no steps that ran this long made progress

_PREFIX = re.compile(r"^\[rank\d+\]:\s?")  # torch's per-rank prefix on a rank's traceback lines
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(?::\s?(.*))?$")


@dataclass(frozen=True)
class FailureRecord:
    """One failed attempt, as far as repeating goes: where it failed, and the newest step it reached."""

    where: str
    step: int | None  # None: before the first step
    traceback: bool  # ``where`` names an exception and its frame (not only an exit code)


def record_of(failure: Failure, step: int | None) -> FailureRecord:
    """The record of ``failure`` after an attempt that reached ``step`` (None: no step)."""
    exception, frame = _last_exception(failure.tail)
    if exception is not None:
        where = f"{exception} at {frame}" if frame else exception
        return FailureRecord(where, step, True)
    return FailureRecord(f"{failure.label} exit code {failure.exit_code} {failure.cause}".strip(), step, False)


def _last_exception(tail: list[str]) -> tuple[str | None, str | None]:
    lines = [_PREFIX.sub("", line.rstrip()) for line in tail]
    for index in range(len(lines) - 1, -1, -1):
        if _EXCEPTION.match(lines[index]):
            frames = [m for m in map(_FRAME.match, lines[:index]) if m]
            frame = f"{frames[-1][1]}:{frames[-1][2]} in {frames[-1][3]}" if frames else None
            return lines[index], frame
    return None, None


def repeated(previous: FailureRecord | None, current: FailureRecord) -> str | None:
    """Why restarting would fail the same way again (None: restart)."""
    if previous is None or previous.where != current.where or not current.traceback:
        return None  # a kill, an OOM, an exit without a traceback: nothing says it would repeat
    if previous.step is None and current.step is None:
        return f"the same failure before the first step in two attempts in a row: {current.where}"
    if previous.step is not None and previous.step == current.step:
        return f"the same failure at step {current.step} in two attempts in a row: {current.where}"
    return None


def made_progress(first_step: int | None, ran_for: float) -> bool:
    """Whether a failed attempt trained before it failed: it reported a step, or (no step reports) ran a while."""
    return first_step is not None or ran_for >= PROGRESS_UPTIME


def no_progress_streak(previous: int, progressed: bool) -> int:
    """Failed attempts in a row without progress, counting the one that just failed (0 after progress)."""
    return 0 if progressed else previous + 1


def streak_after(previous: int, progressed: bool, first_cause: str) -> int:
    """The no-progress streak after a failed attempt whose job-wide first failure was ``first_cause``.

    A survivor replaced because it was left behind in an in-place recovery (``run.left_behind``) is mlaunch
    finishing the recovery of the fault before it, not a crash: the streak stays what that fault left (no
    backoff after a fault that followed progress), rather than counting an attempt that had no time to train.
    """
    if first_cause.startswith(LEFT_BEHIND):
        return previous
    return no_progress_streak(previous, progressed)


def restart_delay(backoff: float, max_backoff: float, streak: int) -> float:
    """Seconds to wait before restarting: none after progress, then ``backoff`` doubling per failure in a row."""
    if streak <= 0:
        return 0.0
    return float(min(backoff * (2 ** (streak - 1)), max_backoff))
