"""Files that survive a crash: chunked writes under a deadline, early writeback, fsync.

How a checkpoint's bytes reach the disk, whoever writes them: a rank's own save (through
``shardfile.write_file``) and mlaunch's agent persisting a staged slot (``copy_range_to_file``).
A file is created, filled in chunks (a deadline is checked between chunks, and the kernel is
asked to start writing each large chunk back at once), fsynced, and removed again if any of
that fails; a directory is fsynced after the entries it gained.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable
from typing import Any

_CHUNK = 64 << 20  # large writes go in pieces so a deadline can stop one part-way
SLOW_WRITE_ENV = "MLAUNCH_TEST_SLOW_WRITE"  # seconds to sleep before each shard write (tests only)


class DeadlineExceeded(TimeoutError):
    """A write was abandoned because its deadline passed (nothing it wrote may be committed)."""


def _slow_storage_stub() -> None:
    """Tests simulate slow storage with a sleep inside the writer (both the rank's and the agent's)."""
    delay = os.environ.get(SLOW_WRITE_ENV)
    if delay:
        time.sleep(float(delay))


_SYNC_FILE_RANGE_WRITE = 2
_libc: Any = None


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a range to disk now (``sync_file_range``, Linux).

    Writing a large shard and then fsyncing it costs write time + flush time; starting the
    flush of each chunk as soon as it is written overlaps the two, so the final fsync has
    little left to do. Best effort: where the call does not exist nothing changes.
    """
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        _libc.sync_file_range(fd, ctypes.c_int64(offset), ctypes.c_int64(length), _SYNC_FILE_RANGE_WRITE)
    except (OSError, AttributeError):
        _libc = False


def write_all(fd: int, data: memoryview, deadline: float | None = None, at: int = 0) -> None:
    """``os.write`` until done, in chunks, checking ``deadline`` (time.monotonic) between chunks.

    ``at`` is the file offset the data lands at (for the early writeback of each chunk).
    """
    _in_chunks(fd, data.nbytes, deadline, at, lambda pos, n: os.write(fd, data[pos : pos + n]))


def _in_chunks(fd: int, length: int, deadline: float | None, at: int, put: Callable[[int, int], int]) -> None:
    """``put(pos, n)`` until ``length`` bytes are in ``fd``, checking ``deadline`` before each chunk.

    ``put`` writes at most ``n`` bytes of the source from ``pos`` and returns how many it
    wrote; each large chunk's writeback starts at once (it lands at file offset ``at + pos``).
    """
    pos = 0
    while pos < length:
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded("write deadline passed")
        written = put(pos, min(_CHUNK, length - pos))
        if written >= (1 << 20) and _libc is not False:
            start_writeback(fd, at + pos, written)
        pos += written


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries a directory gained (a new file, a rename) survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_synced(
    path: str | os.PathLike[str], fill: Callable[[int], int], check: Callable[[], None] = lambda: None
) -> int:
    """Create ``path``, let ``fill(fd)`` write it, run ``check``, fsync; a failure removes the partial file.

    The one place that decides how a shard file comes to exist on disk, whether its bytes come
    from process memory (``shardfile.write_file``) or from a staged slot (``copy_range_to_file``).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _slow_storage_stub()  # after the file exists: tests kill a writer while its shard is partial
        size = fill(fd)
        check()
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _remove_quietly(path)
        raise
    os.close(fd)
    return size


def copy_range_to_file(
    path: str | os.PathLike[str],
    src_fd: int,
    offset: int,
    length: int,
    deadline: float | None = None,
    check: Callable[[], None] = lambda: None,
) -> int:
    """Persist ``length`` bytes of ``src_fd`` from ``offset`` (a staged slot) to ``path`` with fsync.

    ``sendfile`` copies inside the kernel: no user-space mapping of the source has to be
    faulted in page by page, so this runs at ``cp`` speed. ``check`` runs before the fsync.
    """

    def send(fd: int) -> int:
        def put(done: int, n: int) -> int:
            sent = os.sendfile(fd, src_fd, offset + done, n)
            if sent <= 0:
                raise OSError(f"sendfile stopped after {done} of {length} bytes")
            return sent

        _in_chunks(fd, length, deadline, 0, put)
        return length

    return create_synced(path, send, check)


def _remove_quietly(path: str | os.PathLike[str]) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
