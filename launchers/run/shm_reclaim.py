"""Shared-memory files unlinked on a thread of their own, off the path between two attempts.

tmpfs frees a file's pages when its last name goes, in that ``unlink`` (or in the ``rename``
that replaces it): about 0.16 s per GiB on the 2-core development machine, under load. An
attempt's staged segments and the segments an in-place recovery kept are the ranks' whole state,
so removing them between two attempts put that time on the recovery's path (from the second fault
on, the last recovery's kept segments; after a whole restart, every staged segment). They are
renamed out of the way first (``retire``: no page is freed, the names are free at once)
and unlinked here meanwhile. The run waits for the unlinks before it ends (``wait``); a run
killed first leaves hidden ``.mlaunch.<run id>.*`` names, which the next mlaunch's sweep of dead
runs removes (``shm_sweep``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time


def retire(paths: list[str]) -> list[str]:
    """Rename ``paths`` to hidden names no reader lists (``.<name>.<ns>.retired``), for ``ShmReclaim.unlink``.

    A rename frees no page (the inode stays whole under its new name, a reader's mapping too): the
    old names are free at once, and the time tmpfs takes to free a large segment is spent off the
    caller's path. ``staging.unlink_run`` removes what a killed mlaunch left so.
    """
    retired = []
    for path in paths:
        head, name = os.path.split(path)
        hidden = os.path.join(head, f".{name}.{time.monotonic_ns()}.retired")
        with contextlib.suppress(OSError):
            os.rename(path, hidden)
            retired.append(hidden)
    return retired


class ShmReclaim:
    """Unlinks retired files in the background (one owner: the run's ``RunContext``)."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []

    def unlink(self, paths: list[str]) -> None:
        """Remove ``paths`` on a daemon thread (the GIL is free while the kernel frees the pages)."""
        if not paths:
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(target=_unlink_all, args=(paths,), name="mlaunch-shm-reclaim", daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self) -> None:
        """Every unlink asked for is done (the run's end: nothing of it stays in shared memory)."""
        for thread in self._threads:
            thread.join()
        self._threads = []


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)
