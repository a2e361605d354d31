"""Write a file so that readers see the old content or the new one, never a torn one.

The one atomic writer for everything mlaunch generates on a node (rank tables, hostfiles,
the pre-start's persisted env, downloaded wheels): a temporary file in the same directory,
fsync, ``os.replace``, then fsync of the directory so the rename itself survives a crash.
Checkpoint shards have their own commit protocol in ``launchers.elastic``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory entry (a rename or a create) to disk; a no-op where that is unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, mode: int = 0o644) -> Path:
    """Replace ``path`` with ``data`` atomically and durably; returns the path."""
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)
    return target
