"""Storage of its own for a test: an ext4 image, loop-mounted, that ``fsfreeze`` can stop (root only).

A frozen filesystem blocks every write in the kernel until it is thawed, as storage that stops answering
does: the real thing, not a mock. Shared by the tests that stall a commit and that judge a rank blocked in D.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def loop_mounted(tmp: Path, mib: int) -> Iterator[Path]:
    """A fresh ext4 filesystem of ``mib`` MiB mounted under ``tmp``; thawed and unmounted at the end. Skips the test
    where it cannot be had (not root, no fsfreeze or mkfs.ext4, no loop device)."""
    if os.geteuid() != 0 or not (shutil.which("fsfreeze") and shutil.which("mkfs.ext4")):
        pytest.skip("needs root, fsfreeze and mkfs.ext4 (storage that stops answering)")
    image, mount = tmp / "storage.img", tmp / "storage"
    mount.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(mib << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot loop-mount a filesystem here: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["fsfreeze", "--unfreeze", str(mount)], capture_output=True)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
