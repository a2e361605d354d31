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

For ``hang_timeout: auto`` the file also says when the rank's main thread last ran Python
(``_watch_python``): a daemon thread asks the interpreter to run a tiny pending call every
``PYTHON_EVERY`` s, which runs only between two bytecodes of the main thread and stamps the time.
A silent rank with a fresh stamp is busy (an evaluation, a save), not hung
(``launchers.observe.hang_limit``).

For the status view, straggler detection and the goodput report the file also keeps the
first step and time this process reported, the seconds it spent waiting for other ranks
(``waiting()``; ``guard.should_stop`` wraps its agreement in it), the seconds its
checkpoint saves blocked training and its newest committed step. A rank's *own* time per
step is then the step interval less the waits and saves: in lock-step training every rank's
interval is the same (the fast ones wait for the slow one in a collective), the own time is
not.
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
from collections.abc import Iterator
from dataclasses import dataclass

from launchers.elastic.ipc import python_watch
from launchers.elastic.ranks import env

STACK_SIGNAL = signal.SIGURG
MAGIC = b"MLPROG01"
SIZE = 136
_HEAD = struct.Struct("<8sqqqi")  # magic, pid, rank, attempt, stack signal (0: not registered)
_BEAT = struct.Struct("<qQdd")  # step, count, monotonic, wall
_BEAT_AT = 64
_GUARDED = struct.Struct("<i")  # 1: this process handles stop signals itself (``launchers.elastic``'s guard)
_GUARDED_AT = 36
_FIRST = struct.Struct("<qd")  # first step reported, its wall time
_FIRST_AT = 40
_WAITING = struct.Struct("<d")  # monotonic time this process entered ``waiting()``; 0.0: not inside it
_WAITING_AT = 56
_EXTRA = struct.Struct("<ddq")  # seconds waiting for other ranks, seconds blocked saving, committed step
_EXTRA_AT = 96
_STARTED_OVER = struct.Struct("<q")  # the newest committed step this rank could not load and started over from; -1
_STARTED_OVER_AT = 120
_PYTHON = struct.Struct("<d")  # monotonic time the main thread last ran Python (``watch_python``); 0.0: not watched
_PYTHON_AT = 128
PYTHON_EVERY = python_watch.PYTHON_EVERY


def _shm_dir() -> str:
    return env.shm_dir()


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
_waited = 0.0
_saving = 0.0
_committed = -1
_started_over = -1
_first_written = False
_guarded = 0
_depth = 0  # nesting of ``waiting()``
_imports_at = 3  # the report count at which this rank next lists its imports (× 10 each time)


def _env_rank() -> int:
    return env.env_rank()


def _open() -> mmap.mmap | None:
    global _map, _off
    run_id = env.run_id()
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
    attempt = env.attempt()
    _HEAD.pack_into(mm, 0, MAGIC, pid, _env_rank(), attempt, _stack_signal)
    _BEAT.pack_into(mm, _BEAT_AT, -1, 0, 0.0, 0.0)
    _FIRST.pack_into(mm, _FIRST_AT, -1, 0.0)
    _GUARDED.pack_into(mm, _GUARDED_AT, _guarded)
    _EXTRA.pack_into(mm, _EXTRA_AT, _waited, _saving, _committed)
    _WAITING.pack_into(mm, _WAITING_AT, 0.0)
    _STARTED_OVER.pack_into(mm, _STARTED_OVER_AT, _started_over)
    _PYTHON.pack_into(mm, _PYTHON_AT, 0.0)
    _map = mm
    python_watch.start(_stamp_python)
    return mm


def report(step: int | None) -> None:
    """This rank made progress (reached ``step``); a no-op outside mlaunch."""
    global _count, _first_written
    mm = _mapping()
    if mm is None:
        return
    _count += 1
    if _count == _imports_at:
        _report_imports()
    wall = time.time()
    number = -1 if step is None else step
    if not _first_written and step is not None:
        _FIRST.pack_into(mm, _FIRST_AT, number, wall)
        _first_written = True
    _EXTRA.pack_into(mm, _EXTRA_AT, _waited, _saving, _committed)
    _BEAT.pack_into(mm, _BEAT_AT, number, _count, time.monotonic(), wall)


def _mapping() -> mmap.mmap | None:
    if _map is None and not _off:
        return _open()
    return _map


def mark_guarded(on: bool = True) -> None:
    """This process stops gracefully on a stop signal and stops its own children (DataLoader workers).

    mlaunch then sends stop signals (SIGTERM, SIGINT, SIGUSR1/2) to this process, not to its
    descendants: a DataLoader worker that gets SIGTERM dies (torch's worker handler re-raises
    it unless it came from its parent), and torch then fails the rank mid-step. SIGKILL at
    the end of the grace period still reaches the whole process group.
    """
    global _guarded
    _guarded = int(on)
    mm = _mapping()
    if mm is not None:
        _GUARDED.pack_into(mm, _GUARDED_AT, _guarded)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Time spent in here is waiting for other ranks (a collective), not this rank's own work.

    ``guard.should_stop`` wraps its agreement in it. Straggler detection compares the ranks'
    own time per step, so in lock-step training wrap what waits for the others (e.g.
    ``loss.backward()`` under DDP, whose all-reduce waits for the slowest rank) to let the
    slow rank stand out. The file also says *that* the process is inside (since when): when a
    hang is declared, the ranks outside a collective wait are named first — the one the
    others wait for. Costs two clock reads and two 8-byte writes; a no-op outside mlaunch.
    """
    global _waited, _depth
    started = time.monotonic()
    _depth += 1
    if _depth == 1:
        _mark_waiting(started)
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _mark_waiting(0.0)
            _waited += time.monotonic() - started  # the outermost wait only: nested ones are inside it


def _mark_waiting(since: float) -> None:
    mm = _mapping()
    if mm is not None:
        _WAITING.pack_into(mm, _WAITING_AT, since)


def saved(seconds: float, committed_step: int | None) -> None:
    """A checkpoint save blocked training for ``seconds`` (and committed ``committed_step``)."""
    global _saving, _committed
    _saving += max(0.0, seconds)
    if committed_step is not None:
        _committed = committed_step
    mm = _mapping()
    if mm is not None:
        _EXTRA.pack_into(mm, _EXTRA_AT, _waited, _saving, _committed)


def started_over(newest_committed: int) -> None:
    """This rank trains from scratch although ``newest_committed`` is committed (``checkpoint.on_unreadable``).

    mlaunch's status view and events.jsonl show it: a fresh start over committed work is never silent.
    """
    global _started_over
    _started_over = newest_committed
    mm = _mapping()
    if mm is not None:
        _STARTED_OVER.pack_into(mm, _STARTED_OVER_AT, _started_over)


heartbeat = report  # ``elastic.heartbeat(step)``: for scripts that call neither should_stop nor stage


def _report_imports() -> None:
    """At the 3rd, 30th, 300th… report: the rank's installed imports, for standbys to learn (``preload_learning``)."""
    global _imports_at
    _imports_at *= 10
    if os.environ.get("MLAUNCH_REPORT_IMPORTS") == "1":
        from launchers.elastic.ipc import import_report

        import_report.write_for_this_rank()


def report_as_new_rank() -> None:
    """This forked process is a new rank (a standby forked by mlaunch's warm parent), not a data-loader worker."""
    global _off
    _off = False


def _stamp_python() -> None:
    """The main thread ran Python just now (``python_watch``): the time goes into this rank's file."""
    mm = _map
    if mm is not None:
        _PYTHON.pack_into(mm, _PYTHON_AT, time.monotonic())


def reopen() -> None:
    """This process joins a new attempt in place (``elastic.recoverable``): its next report opens a new file.

    mlaunch removed the old attempt's files; the new one carries the new attempt and rank, and starts
    its own first step and counts (what the old attempt waited and saved stays in the totals).
    """
    global _map, _count, _off, _first_written
    if _map is not None:
        with contextlib.suppress(BufferError, ValueError):
            _map.close()
    _map, _count, _off, _first_written = None, 0, False, False


def _after_fork_in_child() -> None:
    """A forked child (a data-loader worker) is not the rank: it must not write the parent's file."""
    global _map, _count, _off, _first_written, _guarded, _depth
    _map, _count, _off, _first_written, _guarded, _depth = None, 0, True, False, 0, 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def install_stack_dump() -> bool:
    """Under mlaunch: ``STACK_SIGNAL`` writes every thread's Python stack to stderr (idempotent)."""
    global _stack_signal
    if _stack_signal or not env.run_id():
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
    first_step: int = -1
    first_wall: float = 0.0
    waited: float = 0.0  # seconds in ``waiting()`` so far
    saving: float = 0.0  # seconds checkpoint saves blocked training so far
    committed_step: int = -1
    guarded: bool = False
    waiting_since: float = 0.0  # monotonic time it entered ``waiting()`` (a collective); 0.0: not inside one
    started_over: int = -1  # it started from scratch although this step was committed (``started_over``)
    python_at: float = 0.0  # monotonic time its main thread last ran Python; 0.0: not watched

    @property
    def in_collective(self) -> bool:
        """Inside ``waiting()`` now: blocked on other ranks, not on its own work."""
        return self.waiting_since > 0.0


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
    first_step, first_wall = _FIRST.unpack_from(data, _FIRST_AT)
    waited, saving, committed = _EXTRA.unpack_from(data, _EXTRA_AT)
    (guarded,) = _GUARDED.unpack_from(data, _GUARDED_AT)
    (waiting_since,) = _WAITING.unpack_from(data, _WAITING_AT)
    (over,) = _STARTED_OVER.unpack_from(data, _STARTED_OVER_AT)
    (python_at,) = _PYTHON.unpack_from(data, _PYTHON_AT)
    return Progress(
        path,
        pid,
        rank,
        attempt,
        stack_signal,
        step,
        count,
        mono,
        wall,
        first_step=first_step,
        first_wall=first_wall,
        waited=waited,
        saving=saving,
        committed_step=committed,
        guarded=guarded == 1,
        waiting_since=waiting_since,
        started_over=over,
        python_at=python_at,
    )


def read_run(run_id: str) -> list[Progress]:
    """Every readable progress file of the run."""
    return [p for p in map(read, run_files(run_id)) if p is not None]


def guarded_pids(run_id: str) -> set[int]:
    """The processes of the run that handle stop signals themselves (``mark_guarded``)."""
    return {p.pid for p in read_run(run_id) if p.guarded}


def unstarted_pids(run_id: str) -> set[int]:
    """Guarded processes of the run that have not reached a step boundary yet (no report).

    Such a rank's only save is the guard's agreed stop at a step boundary it has not reached:
    what it would save is the state it started from.
    """
    return {p.pid for p in read_run(run_id) if p.guarded and p.count == 0}
