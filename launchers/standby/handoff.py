"""What mlaunch hands a standby with the worker it becomes, besides argv, env and cwd.

Its own module so that the pool (``standby_pool``) stays about the pool: which rank may wait for
rank 0's store, and mlaunch's rlimits, signal mask and umask at the moment of the hand-off.
"""

from __future__ import annotations

import contextlib
import signal

STORE_WAIT_SECONDS = 1.0  # the most a warm rank waits for rank 0's store (see standby.wait_for_listener)


def store_to_wait_for(env: dict[str, str]) -> tuple[str, int] | None:
    """(MASTER_ADDR, MASTER_PORT) for a torch.distributed rank other than 0, else None."""
    host, port, rank = env.get("MASTER_ADDR"), env.get("MASTER_PORT", ""), env.get("RANK", "")
    if not host or not (port + rank).isascii() or not port.isdigit() or not rank.isdigit() or rank == "0":
        return None
    return host, int(port)


def launcher_state() -> dict[str, object]:
    """mlaunch's rlimits, signal mask and umask now: what a process it started now would inherit.

    A standby was started (or forked) earlier, by a warm parent started earlier still; it takes
    these on with the worker it becomes (``standby.become``), so that a warm rank runs with the
    limits a cold one would have got at the same moment.
    """
    import resource

    limits = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            with contextlib.suppress(ValueError, OSError):
                limits[name] = list(resource.getrlimit(getattr(resource, name)))
    mask = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    state: dict[str, object] = {"rlimits": limits, "sigmask": mask}
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                state["umask"] = int(line.split()[1], 8)
    return state
