"""Shared memory that dead runs left behind: told apart by a lock only a live run holds, and removed.

A run's staging segments, progress files and import reports live in ``/dev/shm``
(``$MLAUNCH_SHM_DIR``) under its run id. mlaunch removes them after every attempt, and its
watchdog does when mlaunch is SIGKILLed; when the whole process group is SIGKILLed at once (a
container's cgroup kill, a test's timeout) nobody does, and tmpfs keeps them until the machine
restarts (11 GB of them on the development machine). So each run holds an exclusive ``flock`` on
``mlaunch.<run id>.alive`` for its whole life — the watchdog, forked after, holds it too — and
every mlaunch, as it starts, removes the files of the runs whose lock nobody holds. A run without
a lock file (from an mlaunch before this one) is left alone: nothing says it is dead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections import defaultdict

from launchers.elastic.ranks.env import shm_dir

RUN_FILE = re.compile(r"^\.?mlaunch\.([0-9a-f]{32})\.")  # every file a run keeps in shared memory


def alive_path(run_id: str) -> str:
    return os.path.join(shm_dir(), f"mlaunch.{run_id}.alive")


def hold(run_id: str) -> int | None:
    """Lock this run's ``alive`` file for the life of the process (and its forks); the fd, or None.

    Built under a hidden name and locked before it is renamed into place, so a sweeper never finds
    the file of a live run unlocked.
    """
    path = alive_path(run_id)
    building = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.new")
    try:
        fd = os.open(building, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:
        return None  # no shared memory directory: nothing to protect either
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(building, path)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(building)
        return None
    return fd


def unlink_alive(run_id: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(alive_path(run_id))


def _dead(path: str) -> bool:
    """Nobody holds the run's lock (its mlaunch and watchdog are gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # removed meanwhile: its run cleaned up after itself
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock if taken
    return True


def sweep(own_run: str) -> tuple[int, int]:
    """Remove the files of every dead run in the shared memory directory: (files, runs) removed."""
    directory = shm_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0, 0
    by_run: dict[str, list[str]] = defaultdict(list)
    for name in names:
        match = RUN_FILE.match(name)
        if match and match.group(1) != own_run:
            by_run[match.group(1)].append(name)
    files = runs = 0
    for run_id, run_names in by_run.items():
        alive = os.path.basename(alive_path(run_id))
        if alive not in run_names or not _dead(os.path.join(directory, alive)):
            continue
        runs += 1
        for name in sorted(run_names, key=lambda n: n == alive):  # the lock file last: a crash leaves it findable
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
                files += 1
    return files, runs
