"""How an attempt ended: exit codes, the first failure, the outcome the runner acts on.

Exit codes are shell-style wherever mlaunch reports one: a process killed by signal N has
exit code 128+N (``os.waitstatus_to_exitcode`` says -N).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from launchers.log import signal_name
from launchers.plan import ProcessSpec

if TYPE_CHECKING:
    from launchers.control import RemoteFailure


def exit_status(status: int) -> tuple[int, int | None]:
    """waitpid status → (shell-style exit code, the signal that killed the process or None)."""
    try:
        code = os.waitstatus_to_exitcode(status)
    except ValueError:  # neither exited nor killed (stopped): no exit code of its own
        return 1, None
    if code < 0:
        return 128 - code, -code
    return code, None


@dataclass
class Failure:
    label: str
    rank: int
    pid: int
    exit_code: int
    signal: int | None
    tail: list[str]
    log: str | None
    cause: str = ""  # how it failed when it did not exit by itself (e.g. "made no progress for 5m")
    details: dict[str, Any] = field(default_factory=dict)  # for events.jsonl: a hang's ranks in and out of collectives

    def describe(self) -> str:
        who = f"{self.label} (pid {self.pid})" if self.pid else self.label  # pid 0: on another node
        if self.cause:
            return f"{who} {self.cause}"
        if self.signal is not None:
            how = f"was killed by {signal_name(self.signal)} (exit code {self.exit_code})"
        else:
            how = f"exited with code {self.exit_code}"
        return f"{who} {how}"


def remote_failure(event: RemoteFailure) -> Failure:
    """Another node's first failure, as this node's outcome reports it (no pid, log or tail here)."""
    return Failure(event.node_label, event.rank, 0, event.exit_code, event.signal, [], None, cause=event.cause)


def launch_failure(spec: ProcessSpec, label: str, exc: OSError) -> Failure:
    """A process that could not be started: 127 when its program is missing, else 126 (as a shell says)."""
    code = 127 if isinstance(exc, FileNotFoundError) else 126
    return Failure(label, spec.rank, 0, code, None, [f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}"], spec.log)


Status = Literal["succeeded", "failed", "signalled", "reformed"]


@dataclass
class Outcome:
    """How an attempt ended. ``reformed``: an elastic job's membership changed (``change`` says how): not a failure."""

    status: Status
    exit_code: int
    failure: Failure | None = None
    signal: int | None = None
    exit_codes: dict[str, int] = field(default_factory=dict)  # label → exit code
    grace_expired: bool = False  # workers were still alive when the grace period ended (SIGKILLed)
    stop_started: float | None = None  # time.monotonic() when the stop (SIGTERM to the workers) began
    change: str = ""  # ``reformed``: the membership change that ended the attempt (a node left, node 0 regrouped)
    finished_aborts: list[str] = field(default_factory=list)  # ranks that died after reporting completion


class Ended(Protocol):
    """A supervised process as the outcome sees it."""

    label: str
    returncode: int | None


def outcome_of(
    processes: Iterable[Ended],
    failure: Failure | None,
    sig: int | None,
    *,
    grace_expired: bool,
    stop_started: float | None,
    change: str = "",
    finished_aborts: list[str] | None = None,
    finished: bool = False,
) -> Outcome:
    """A stop signal to mlaunch; else a membership change (the attempt re-forms); else the first failure; else success.

    ``sig`` is a stop signal mlaunch itself received (a preemption, Ctrl-C), never the SIGTERM
    it sent its ranks. One that came while the ranks stopped for a re-form still stops this
    node: re-forming would drop the platform's request, and its SIGKILL would follow the grace
    period. A failure keeps its own exit code with the signal beside it (the restart loop then
    does not restart: ``RestartLoop``).

    ``finished``: this node's ranks finished the training on their own (one exited 0 before any
    stop, all exited 0); a membership change that came as they did is moot: the job succeeded.
    """
    codes = {p.label: p.returncode for p in processes if p.returncode is not None}
    if change and sig is None and not finished:
        outcome = Outcome("reformed", 0, exit_codes=codes, change=change)
    elif sig is not None and failure is None:
        outcome = Outcome("signalled", 128 + sig, signal=sig, exit_codes=codes)
    elif failure is not None:
        outcome = Outcome("failed", failure.exit_code or 1, failure=failure, signal=sig, exit_codes=codes)
    else:
        outcome = Outcome("succeeded", 0, exit_codes=codes)
    outcome.grace_expired = grace_expired
    outcome.stop_started = stop_started
    outcome.finished_aborts = list(finished_aborts or [])
    return outcome
