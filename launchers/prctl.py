"""Linux ``prctl`` for the few process settings mlaunch relies on (both the launcher and ``bootstrap`` use it).

Best effort: where the call does not exist (not Linux) every function says False and nothing changes.
"""

from __future__ import annotations

import ctypes

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc: ctypes.CDLL | None = None


def resolve() -> None:
    """Load libc and look ``prctl`` up now, in the parent: a forked child of a process with threads must not
    ``dlopen``/``dlsym`` (the loader's lock may have been held by another thread at the fork)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl  # noqa: B018 - ctypes caches the looked-up function on the library object
    except (OSError, AttributeError):
        pass


def prctl(option: int, value: int) -> bool:
    resolve()
    try:
        return _libc is not None and int(_libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int) -> bool:
    """``sig`` to this process when its parent dies (``PR_SET_PDEATHSIG``)."""
    return prctl(PR_SET_PDEATHSIG, sig)
