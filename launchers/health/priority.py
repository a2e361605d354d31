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
from collections.abc import Iterator
from pathlib import Path

RAISED_NICE = -10
AUTOGROUP = Path("/proc/self/autogroup")


@contextlib.contextmanager
def raised_priority() -> Iterator[None]:
    """This thread's nice value and its session's autogroup raised for the block, restored after.

    On Linux a nice value belongs to a thread and a thread inherits its creator's, so the
    threads started inside the block (gloo's I/O and worker threads) run raised too.
    """
    try:
        old: int | None = os.getpriority(os.PRIO_PROCESS, 0)  # this thread (Linux)
        os.setpriority(os.PRIO_PROCESS, 0, RAISED_NICE)
    except OSError:
        old = None
    group = _raise_autogroup()
    try:
        yield
    finally:
        if old is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, old)
        if group is not None:
            with contextlib.suppress(OSError):
                AUTOGROUP.write_text(group)


def _raise_autogroup() -> str | None:
    """Raise this session's autogroup nice (kernels with sched_autogroup split the CPU between
    sessions first, so a thread's own nice value counts only inside its session); the old value."""
    try:
        old = AUTOGROUP.read_text().split("nice")[-1].strip()
        AUTOGROUP.write_text(str(RAISED_NICE))
    except (OSError, IndexError):
        return None
    return old
