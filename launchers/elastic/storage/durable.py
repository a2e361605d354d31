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
import mmap
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from launchers.elastic.storage import direct_io

_CHUNK = 64 << 20  # large writes go in pieces so a deadline can stop one part-way

# Called once a shard file exists, before its bytes go in; None in users' jobs. Tests that need
# slow storage (a deadline that passes, a writer killed while its shard is partial) set it in
# their own process, or through tests/scripts/slow_storage/sitecustomize.py for a process tree.
before_fill: Callable[[], None] | None = None


class DeadlineExceeded(TimeoutError):
    """A write was abandoned because its deadline passed (nothing it wrote may be committed)."""


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


def deadline_check(deadline: float | None) -> Callable[[], None]:
    """A callable that raises ``DeadlineExceeded`` once ``deadline`` (time.monotonic) has passed."""

    def check() -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded("write deadline passed")

    return check


def write_image(fd: int, pieces: Iterable[tuple[int, memoryview]], length: int, deadline: float | None) -> bool:
    """Write an image of ``length`` bytes from ordered ``(offset, bytes)`` pieces past the page cache.

    Returns False (nothing written) where direct writes are not wanted or not supported:
    the caller then writes buffered.
    """
    if not direct_io.wanted(length):
        return False
    try:
        direct_io.write_pieces(fd, pieces, length, deadline_check(deadline))
    except direct_io.Unsupported:
        return False
    return True


def _in_chunks(fd: int, length: int, deadline: float | None, at: int, put: Callable[[int, int], int]) -> None:
    """``put(pos, n)`` until ``length`` bytes are in ``fd``, checking ``deadline`` before each chunk.

    ``put`` writes at most ``n`` bytes of the source from ``pos`` and returns how many it
    wrote; each large chunk's writeback starts at once (it lands at file offset ``at + pos``).
    """
    pos = 0
    check_deadline = deadline_check(deadline)
    while pos < length:
        check_deadline()
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
        if before_fill is not None:
            before_fill()  # after the file exists: tests kill a writer while its shard is partial
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

    A large page-aligned slot goes to the disk straight from its shared-memory pages
    (``direct_io``); otherwise ``sendfile`` copies inside the kernel, at ``cp`` speed.
    ``check`` runs before the fsync.
    """

    def send(fd: int) -> int:
        if _copy_direct(fd, src_fd, offset, length, deadline):
            return length

        def put(done: int, n: int) -> int:
            sent = os.sendfile(fd, src_fd, offset + done, n)
            if sent <= 0:
                raise OSError(f"sendfile stopped after {done} of {length} bytes")
            return sent

        _in_chunks(fd, length, deadline, 0, put)
        return length

    return create_synced(path, send, check)


def _copy_direct(fd: int, src_fd: int, offset: int, length: int, deadline: float | None) -> bool:
    """``O_DIRECT`` from a mapping of the source; False (nothing written) where that cannot be done."""
    whole = direct_io.round_up(length)
    if not direct_io.wanted(length) or offset % mmap.ALLOCATIONGRANULARITY:
        return False
    if os.fstat(src_fd).st_size < offset + whole:
        return False  # the last page is not in the source file
    source = mmap.mmap(src_fd, whole, prot=mmap.PROT_READ, offset=offset)
    view = memoryview(source)
    try:
        direct_io.write_mapped(fd, view, length, deadline_check(deadline))
    except direct_io.Unsupported:
        return False
    finally:
        view.release()
        source.close()
    return True


def _remove_quietly(path: str | os.PathLike[str]) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
