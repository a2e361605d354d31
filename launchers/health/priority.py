"""A raised scheduling priority for the few hundred milliseconds a health probe times something.

The probes are meant to measure the machine and its network, not whatever else is queued
on the host before training (a log shipper, another container, on node 0 the control
plane's hub): a raised nice value (root or CAP_SYS_NICE; silently skipped otherwise) wins
the CPU from ordinary processes while the probe runs. A CPU quota (a cgroup limit, a
throttled VM) still caps it, which is what the probe should see.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

RAISED_NICE = -10
AUTOGROUP = Path("/proc/self/autogroup")


@contextlib.contextmanager
def raised_priority() -> Iterator[None]:
    """This thread's nice value and its session's autogroup raised for the block, restored after.

    On Linux a nice value belongs to a thread and a thread inherits its creator's, so the
    threads started inside the block (gloo's I/O and worker threads) run raised too.

    A session's autogroup is shared by every process in it — the simulated nodes of a local
    check, or several probes of one container — and they probe at overlapping moments. Each
    restores only what it raised itself: one that finds the value already raised leaves it to
    whoever raised it, so no interleaving leaves a session raised after the last probe (the
    first prober read the original; a later one would read the raised value and "restore" it).
    """
    thread = _raise(_thread_nice_get, _thread_nice_set)
    group = _raise(_autogroup_get, _autogroup_set)
    try:
        yield
    finally:
        for restore in (group, thread):
            if restore is not None:
                with contextlib.suppress(OSError):
                    restore()


def _raise(get: Callable[[], int], put: Callable[[int], None]) -> Callable[[], None] | None:
    """Raise to ``RAISED_NICE``; what restores the old value, or None when there is nothing of ours to undo."""
    try:
        old = get()
        if old <= RAISED_NICE:  # raised already (by another prober) or set higher by the operator: not ours
            return None
        put(RAISED_NICE)
    except (OSError, ValueError, IndexError):  # not allowed (no CAP_SYS_NICE), or no autogroup in this kernel
        return None
    return lambda: put(old)


def _thread_nice_get() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)  # this thread (Linux)


def _thread_nice_set(value: int) -> None:
    os.setpriority(os.PRIO_PROCESS, 0, value)


def _autogroup_get() -> int:
    """This session's autogroup nice (kernels with sched_autogroup split the CPU between sessions
    first, so a thread's own nice value counts only inside its session)."""
    return int(AUTOGROUP.read_text().split("nice")[-1].strip())


def _autogroup_set(value: int) -> None:
    AUTOGROUP.write_text(str(value))
