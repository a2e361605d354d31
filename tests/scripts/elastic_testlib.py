"""Helpers shared by the graceful-exit tests (test_checkpoint, test_flash_save, test_chaos...).

Imported by putting tests/scripts on sys.path; no test lives here.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "pytorch" / "train.py"
CHAOS = ROOT / "tests" / "scripts" / "chaos_train.py"
SLOW_STORAGE = ROOT / "tests" / "scripts" / "slow_storage"


def slow_storage_env(seconds: float) -> dict[str, str]:
    """Env for a job whose every process sleeps ``seconds`` before filling each shard file it writes.

    mlaunch's own persist included: ``slow_storage/sitecustomize.py`` sets ``durable.before_fill``
    in each process (the library reads no test variable).
    """
    path = os.pathsep.join(filter(None, [str(SLOW_STORAGE), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "TEST_SLOW_WRITE_SECONDS": str(seconds)}


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path | None]:
    """A real, small tmpfs at ``path`` (root only); yields None when mounting is refused."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
        )
    except OSError:
        yield None
        return
    if done.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def fill(path: Path, leave: int = 0) -> Path:
    """Fill the filesystem of ``path`` until at most ``leave`` bytes are free."""
    filler = path / f"filler-{uuid.uuid4().hex[:6]}"
    with open(filler, "wb") as fh:
        chunk = b"\0" * 4096
        while True:
            st = os.statvfs(path)
            if st.f_bavail * st.f_frsize <= leave:
                break
            try:
                fh.write(chunk)
                fh.flush()
            except OSError:
                break
    return filler


def wait_for(predicate: Callable[[], object], timeout: float = 60.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def final_checksum(stdout: str) -> str | None:
    found = re.findall(r"final-checksum ([0-9a-f]+)", stdout)
    return found[-1] if found else None


def run_id_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"MLAUNCH_RUN_ID="):
            return item.split(b"=", 1)[1].decode()
    return None


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (psutil; [] once it is gone)."""
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []
