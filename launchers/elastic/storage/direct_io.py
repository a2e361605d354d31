"""Large shard writes that bypass the page cache (``O_DIRECT``), falling back to buffered writes.

Why: a dying checkpoint has to reach the disk within a grace period, on a node whose memory
is full of the training state. A buffered write first copies every byte into freshly
allocated page-cache pages and only then lets the kernel flush them; on a loaded host
(or a VM whose freed memory went back to the hypervisor) allocating that many pages is
itself slow. ``O_DIRECT`` hands the pages to the disk as they are: from the staged slot
in shared memory without any copy (the agent's flash save), or through one reused,
page-aligned bounce buffer (a rank's own save from process memory). DeepSpeed's
FastPersist writes checkpoints the same way.

The rules ``O_DIRECT`` imposes: buffer address, file offset and length aligned to the
device's block size (a page covers every block size in use). A shard's last partial
page is written whole and the file truncated back to its size. Where a file system
refuses ``O_DIRECT`` (tmpfs on older kernels, some FUSE mounts: ``EINVAL``) the caller
writes buffered instead; ``MLAUNCH_DIRECT_IO=0`` turns the direct path off altogether,
for a file system where direct writes are slower than buffered ones.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from collections.abc import Callable, Iterable

PAGE = mmap.PAGESIZE
CHUNK = 64 << 20  # bytes per write: large enough for full disk throughput, small enough for a deadline check
MIN_SIZE = 16 << 20  # smaller shards gain nothing: the page cache absorbs them at once
DIRECT_IO_ENV = "MLAUNCH_DIRECT_IO"
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class Unsupported(OSError):
    """This file (system) does not take direct writes; nothing was written."""


def wanted(size: int) -> bool:
    """Whether a file of ``size`` bytes should be written directly."""
    return bool(_O_DIRECT) and size >= MIN_SIZE and os.environ.get(DIRECT_IO_ENV, "1") != "0"


def round_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _switch_on(fd: int) -> int:
    """Set ``O_DIRECT`` on ``fd``; returns the previous flags. ``Unsupported`` if refused."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            raise Unsupported(exc.errno, "direct writes refused") from None
        raise
    return flags


Before = Callable[[], None]  # runs before each chunk: the caller's deadline check raises from it


def _put(fd: int, view: memoryview, at: int, before: Before, first: bool) -> None:
    """One aligned ``pwrite`` of all of ``view`` at ``at`` (a short write is continued)."""
    before()
    done = 0
    while done < view.nbytes:
        try:
            n = os.pwrite(fd, view[done:], at + done)
        except OSError as exc:
            if first and done == 0 and exc.errno == errno.EINVAL:
                raise Unsupported(exc.errno, "direct write refused") from None
            raise
        if n <= 0 or n % PAGE:
            raise OSError(errno.EIO, f"direct write stopped after {done + max(n, 0)} of {view.nbytes} bytes")
        done += n


def write_mapped(fd: int, source: memoryview, length: int, before: Before) -> None:
    """Write ``length`` bytes of ``source`` (page-aligned memory holding ≥ ``length`` rounded up to a page).

    No copy is made: the pages of ``source`` (a staged slot) go to the disk as they are.
    ``Unsupported`` if the file system refuses before anything was written.
    """
    whole = round_up(length)
    if source.nbytes < whole:
        raise ValueError("the source does not cover the last page")
    flags = _switch_on(fd)
    try:
        for at in range(0, whole, CHUNK):
            with source[at : min(whole, at + CHUNK)] as piece:  # released even when a write fails
                _put(fd, piece, at, before, first=at == 0)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    os.ftruncate(fd, length)


def write_pieces(fd: int, pieces: Iterable[tuple[int, memoryview]], length: int, before: Before) -> None:
    """Write an image given as ordered ``(offset, bytes)`` pieces (gaps are zeros) through a bounce buffer.

    Process memory (a tensor's storage) is not page-aligned, so each ``CHUNK`` of the image
    is gathered into one aligned anonymous mapping first; memory bandwidth is an order of
    magnitude above the disk's, so the copy costs little of the write's time.
    """
    flags = _switch_on(fd)
    bounce = mmap.mmap(-1, min(CHUNK, round_up(length)))
    buf = memoryview(bounce)
    try:
        written = filled = 0

        def flush(upto: int) -> None:
            nonlocal written, filled
            with buf[:upto] as piece:  # released even when a write fails: the mapping can close
                _put(fd, piece, written, before, first=written == 0)
            written += upto
            filled = 0

        def add(view: memoryview) -> None:
            nonlocal filled
            pos = 0
            while pos < view.nbytes:
                n = min(view.nbytes - pos, buf.nbytes - filled)
                buf[filled : filled + n] = view[pos : pos + n]
                filled += n
                pos += n
                if filled == buf.nbytes:
                    flush(filled)

        zeros = memoryview(bytes(min(CHUNK, 1 << 20)))
        for offset, view in [*pieces, (length, memoryview(b""))]:
            while written + filled < offset:  # the gap before this piece (alignment padding)
                add(zeros[: min(zeros.nbytes, offset - written - filled)])
            add(view.cast("B") if view.format != "B" or view.ndim != 1 else view)
        if filled:
            tail = round_up(filled)
            buf[filled:tail] = bytes(tail - filled)
            flush(tail)
    finally:
        buf.release()
        bounce.close()
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    os.ftruncate(fd, length)
