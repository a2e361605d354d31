"""Progress reports from a rank to its node's mlaunch (hang detection), and the stack-dump signal.

A rank under mlaunch reports progress — ``guard.should_stop(step)``, ``ckpt.stage(step, …)``,
``elastic.heartbeat(step)`` — into a small per-process file in shared memory,
``/dev/shm/mlaunch.<run_id>.progress.<pid>`` (``$MLAUNCH_SHM_DIR`` overrides), mapped once:
a report is one ``struct.pack_into`` of (step, count, monotonic time, wall time) into the
mapping, no system call (about a microsecond). mlaunch reads these files to tell a hung rank
(progress reported, then none for ``monitor.hang_timeout``) from a slow one; a rank that
never reported is not judged. The file also says which rank, pid and restart attempt it is.

``install_stack_dump()`` (run when ``launchers.elastic`` is imported under mlaunch) registers
``faulthandler`` on ``STACK_SIGNAL`` (SIGURG): the signal makes the process write the Python
stacks of all its threads to stderr — which mlaunch copies to the rank's log file — even
while the main thread is stuck in C code (a blocked collective, ``time.sleep``). SIGURG is
ignored by default, so mlaunch may send it to every process group of the node without
killing processes that did not register it, and it does not clash with the stop and notice
signals (SIGTERM, SIGINT, SIGUSR1, SIGUSR2).
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import signal
import struct
import sys
import time
from dataclasses import dataclass

STACK_SIGNAL = signal.SIGURG
MAGIC = b"MLPROG01"
SIZE = 128
_HEAD = struct.Struct("<8sqqqi")  # magic, pid, rank, attempt, stack signal (0: not registered)
_BEAT = struct.Struct("<qQdd")  # step, count, monotonic, wall
_BEAT_AT = 64


def _shm_dir() -> str:
    return os.environ.get("MLAUNCH_SHM_DIR") or "/dev/shm"


def progress_path(run_id: str, pid: int) -> str:
    return os.path.join(_shm_dir(), f"mlaunch.{run_id}.progress.{pid}")


def run_files(run_id: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(_shm_dir()), f"mlaunch.{glob.escape(run_id)}.progress.*")))


def unlink_run(run_id: str) -> int:
    """Remove every progress file of ``run_id``; returns how many were removed."""
    removed = 0
    for path in run_files(run_id):
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed += 1
    return removed


# ----------------------------------------------------------------------------------------
# Rank side
# ----------------------------------------------------------------------------------------

_map: mmap.mmap | None = None
_count = 0
_off = False  # not under mlaunch, or the file could not be made: reports are no-ops
_stack_signal = 0


def _env_rank() -> int:
    for name in ("RANK", "RANK_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = os.environ.get(name, "").strip()
        if value.isascii() and value.isdigit():
            return int(value)
    return -1


def _open() -> mmap.mmap | None:
    global _map, _off
    run_id = os.environ.get("MLAUNCH_RUN_ID")
    if not run_id:
        _off = True
        return None
    pid = os.getpid()
    try:
        fd = os.open(progress_path(run_id, pid), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        _off = True
        return None
    attempt = int(os.environ.get("MLAUNCH_RESTART_COUNT", "0") or 0)
    _HEAD.pack_into(mm, 0, MAGIC, pid, _env_rank(), attempt, _stack_signal)
    _BEAT.pack_into(mm, _BEAT_AT, -1, 0, 0.0, 0.0)
    _map = mm
    return mm


def report(step: int | None) -> None:
    """This rank made progress (reached ``step``); a no-op outside mlaunch."""
    global _count
    mm = _map
    if mm is None:
        if _off:
            return
        mm = _open()
        if mm is None:
            return
    _count += 1
    _BEAT.pack_into(mm, _BEAT_AT, -1 if step is None else step, _count, time.monotonic(), time.time())


heartbeat = report  # ``elastic.heartbeat(step)``: for scripts that call neither should_stop nor stage


def _after_fork_in_child() -> None:
    """A forked child (a data-loader worker) is not the rank: it must not write the parent's file."""
    global _map, _count, _off
    _map, _count, _off = None, 0, True


os.register_at_fork(after_in_child=_after_fork_in_child)


def install_stack_dump() -> bool:
    """Under mlaunch: ``STACK_SIGNAL`` writes every thread's Python stack to stderr (idempotent)."""
    global _stack_signal
    if _stack_signal or not os.environ.get("MLAUNCH_RUN_ID"):
        return bool(_stack_signal)
    import faulthandler

    stream = sys.stderr or sys.__stderr__  # the pipe mlaunch copies to the rank's log file
    if stream is None:
        return False
    try:
        faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=True)
    except (AttributeError, OSError, ValueError, RuntimeError):
        return False
    _stack_signal = int(STACK_SIGNAL)
    return True


# ----------------------------------------------------------------------------------------
# Agent side (mlaunch)
# ----------------------------------------------------------------------------------------


@dataclass
class Progress:
    """One rank's newest report, as mlaunch reads it."""

    path: str
    pid: int
    rank: int
    attempt: int
    stack_signal: int
    step: int
    count: int  # reports so far; 0: never reported (not judged)
    monotonic: float
    wall: float


def read(path: str) -> Progress | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(SIZE)
    except OSError:
        return None
    if len(data) < SIZE:
        return None
    magic, pid, rank, attempt, stack_signal = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        return None
    step, count, mono, wall = _BEAT.unpack_from(data, _BEAT_AT)
    return Progress(path, pid, rank, attempt, stack_signal, step, count, mono, wall)


def read_run(run_id: str) -> list[Progress]:
    """Every readable progress file of the run."""
    return [p for p in map(read, run_files(run_id)) if p is not None]
