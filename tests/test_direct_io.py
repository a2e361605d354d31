"""Large shards go to the disk past the page cache (O_DIRECT), byte for byte what a buffered write gives.

Real files on this machine's disk, real shared memory, and a real ramfs mount for a file
system that refuses direct writes (the ramfs test needs root and skips without it).
Whether the bytes went through the page cache is read back with ``mincore``: a buffered
write leaves the file's pages cached, a direct one does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from launchers.elastic.format import shardfile
from launchers.elastic.storage import direct_io, durable

_libc = ctypes.CDLL(None, use_errno=True)


def cached_fraction(path: Path) -> float:
    """Share of the file's pages that are in the page cache (``mincore`` on a private mapping)."""
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec) / pages


def takes_direct_writes(directory: Path) -> bool:
    """Whether this file system accepts O_DIRECT (a CI machine's /tmp may be an overlay that does not)."""
    probe = directory / ".direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        with mmap.mmap(-1, mmap.PAGESIZE) as page:
            os.pwrite(fd, page, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


@pytest.fixture
def direct_dir(tmp_path: Path) -> Path:
    if not takes_direct_writes(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT (the buffered fallback is tested on ramfs)")
    return tmp_path


def state(n: int, seed: int = 0) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(n).astype(np.float32), "b": np.arange(n % 1000 + 3, dtype=np.int16), "step": n}


def test_large_shard_skips_the_page_cache_and_reads_back(direct_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tmp_path = direct_dir
    st = state(10_000_003)  # 40 MB: above direct_io.MIN_SIZE
    direct, buffered = tmp_path / "direct.mlck", tmp_path / "buffered.mlck"
    shardfile.write_file(direct, shardfile.encode(st))
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, "0")
    shardfile.write_file(buffered, shardfile.encode(st))
    assert direct.read_bytes() == buffered.read_bytes()
    # read_bytes above brought both into the cache; drop them and write again to look
    for path in (direct, buffered):
        path.unlink()
    monkeypatch.delenv(direct_io.DIRECT_IO_ENV)
    shardfile.write_file(direct, shardfile.encode(st))
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, "0")
    shardfile.write_file(buffered, shardfile.encode(st))
    assert cached_fraction(direct) < 0.05
    assert cached_fraction(buffered) > 0.9  # the check can tell the two apart
    got, _ = shardfile.read_file(direct)
    assert np.array_equal(got["w"], st["w"]) and np.array_equal(got["b"], st["b"]) and got["step"] == st["step"]


@pytest.mark.parametrize("n", [1, 1023, 4096, 16_385, 70_001])
def test_odd_sizes_chunk_edges_and_padding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Small chunks make every image cross chunk and page edges at odd places; bytes must equal the buffered file's."""
    monkeypatch.setattr(direct_io, "CHUNK", 64 << 10)
    monkeypatch.setattr(direct_io, "MIN_SIZE", 0)
    enc = shardfile.encode(state(n, seed=n))
    shardfile.write_file(tmp_path / "d", enc)
    monkeypatch.setenv(direct_io.DIRECT_IO_ENV, "0")
    shardfile.write_file(tmp_path / "b", enc)
    assert (tmp_path / "d").stat().st_size == enc.size
    assert (tmp_path / "d").read_bytes() == (tmp_path / "b").read_bytes()


@contextlib.contextmanager
def shm_source(size: int) -> Iterator[tuple[int, bytes]]:
    path = Path("/dev/shm") / f"mlaunch-directio-test-{os.getpid()}"
    data = os.urandom(size)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd, data
    finally:
        os.close(fd)
        path.unlink()


def test_agent_copy_from_an_aligned_slot_is_direct_and_an_unaligned_one_is_not(direct_dir: Path) -> None:
    tmp_path = direct_dir
    size = 40 << 20
    with shm_source(size + 2 * mmap.PAGESIZE) as (fd, data):
        length = size - 123  # the last page is partial
        durable.copy_range_to_file(tmp_path / "aligned", fd, mmap.PAGESIZE, length)
        durable.copy_range_to_file(tmp_path / "unaligned", fd, 100, length)
        assert cached_fraction(tmp_path / "aligned") < 0.05
        assert cached_fraction(tmp_path / "unaligned") > 0.9  # sendfile, through the cache
        assert (tmp_path / "aligned").read_bytes() == data[mmap.PAGESIZE : mmap.PAGESIZE + length]
        assert (tmp_path / "unaligned").read_bytes() == data[100 : 100 + length]


def test_a_passed_deadline_stops_a_direct_write_and_leaves_no_file(tmp_path: Path) -> None:
    enc = shardfile.encode(state(10_000_000))
    with pytest.raises(durable.DeadlineExceeded):
        shardfile.write_file(tmp_path / "late.mlck", enc, deadline=time.monotonic() - 1)
    with shm_source(40 << 20) as (fd, _), pytest.raises(durable.DeadlineExceeded):
        durable.copy_range_to_file(tmp_path / "late2", fd, 0, 40 << 20, deadline=time.monotonic() - 1)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    """A real file system without O_DIRECT support (ramfs: EINVAL)."""
    mount = tmp_path / "ramfs"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mount)]).returncode != 0:
        pytest.skip("mounting a ramfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_file_system_that_refuses_direct_writes_gets_buffered_ones(ramfs: Path) -> None:
    st = state(10_000_003)
    shardfile.write_file(ramfs / "shard.mlck", shardfile.encode(st))
    got, _ = shardfile.read_file(ramfs / "shard.mlck")
    assert np.array_equal(got["w"], st["w"])
    with shm_source(40 << 20) as (fd, data):
        durable.copy_range_to_file(ramfs / "slot", fd, 0, 40 << 20)
        assert (ramfs / "slot").read_bytes() == data
