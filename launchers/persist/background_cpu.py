"""The CPU class of mlaunch's own copying threads: below the ranks', so training is never slowed by it.

Replication (``peer_copy``'s sender, ``replica_store``'s receivers) copies a node's staged state
every step — tens of MB of memcpy and socket copies — on the same cores the ranks train on. It is
worth having only if it costs the training nothing, the way its stream yields on the wire
(``peer_copy.low_priority``): at the lowest nice value it runs in the cores' idle time (a rank
waiting on a collective, on the input pipeline) and a rank that wants the core gets it.

A nice value belongs to one thread on Linux, so this lowers only the calling thread: the control
plane's threads in the same process keep their priority (their latency is failure detection's).
Inside a container (a cgroup of its own) the nice value weighs this thread against the ranks; in a
bare session with ``sched_autogroup`` (a desktop kernel, outside any cgroup) sessions split the CPU
first and the ranks, each in a session of its own, are not affected either way.
"""

from __future__ import annotations

import contextlib
import os

LOWEST_NICE = 19


def yield_to_training() -> None:
    """Put the calling thread in the lowest CPU class (nice 19); silently kept as is where not allowed."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, LOWEST_NICE)  # 0: this thread (Linux)
