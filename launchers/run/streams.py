"""The supervised processes' output: streamed with a ``[label]`` prefix, copied to their log files.

Each line a process writes goes to mlaunch's stdout or stderr (as the process wrote it) with
its prefix, in one write per chunk; the raw bytes go, unprefixed, to the process's log file;
the last ``TAIL_LINES`` lines are kept for the failure report. One selector watches every
pipe and the signal wake-up pipe, so the supervision loop wakes on output, a signal or an exit.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, BinaryIO

from launchers.plan import ProcessSpec

TAIL_LINES = 15


@dataclass
class Worker:
    """One supervised process of an attempt."""

    spec: ProcessSpec
    label: str
    prefix: bytes
    popen: subprocess.Popen[bytes]
    log: IO[bytes] | None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    buffers: dict[int, bytes] = field(default_factory=dict)
    returncode: int | None = None
    status: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


class OutputStreams:
    """Every worker's stdout and stderr pipe, read without blocking as data arrives."""

    def __init__(self, out: BinaryIO, err: BinaryIO) -> None:
        self.out = out
        self.err = err
        self._selector = selectors.DefaultSelector()
        self._by_fd: dict[int, tuple[Worker, bool]] = {}
        self._workers: list[Worker] = []
        self._wake_fds: set[int] = set()

    def wake_on(self, fd: int) -> None:
        """Also wake ``wait`` when ``fd`` (signals, the control plane) is readable; its data is left for its owner."""
        self._wake_fds.add(fd)
        self._selector.register(fd, selectors.EVENT_READ, None)

    def add(self, worker: Worker) -> None:
        self._workers.append(worker)
        for stream, is_err in ((worker.popen.stdout, False), (worker.popen.stderr, True)):
            assert stream is not None
            fd = stream.fileno()
            os.set_blocking(fd, False)
            worker.buffers.setdefault(fd, b"")  # an adopted worker keeps its unfinished line
            self._by_fd[fd] = (worker, is_err)
            self._selector.register(fd, selectors.EVENT_READ, None)

    def wait(self, timeout: float) -> bool:
        """Up to ``timeout`` seconds: stream what arrives, return once something did (or a signal).

        True when some process's output arrived."""
        got = False
        for key, _ in self._selector.select(timeout):
            fd = int(key.fd)
            if fd not in self._wake_fds:
                self._read(fd)
                got = True
        return got

    def drain(self, worker: Worker) -> None:
        """Read what an exited process left in its pipes (so its last lines are not lost)."""
        fds = [fd for fd, (w, _) in self._by_fd.items() if w is worker]
        end = time.monotonic() + 0.2
        while fds and time.monotonic() < end:
            ready, _, _ = select.select(fds, [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break
            for fd in ready:
                self._read(fd)
            fds = [fd for fd in fds if fd in self._by_fd]

    def detach(self, worker: Worker) -> None:
        """Stop watching ``worker``'s pipes without closing them or its log: the next attempt adopts it."""
        for fd in [fd for fd, (w, _) in self._by_fd.items() if w is worker]:
            self._read(fd)
            if fd in self._by_fd:
                del self._by_fd[fd]
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(fd)
        if worker in self._workers:
            self._workers.remove(worker)

    def close(self) -> None:
        """Read what is left (up to half a second per pipe), close the pipes and the log files."""
        for fd in list(self._by_fd):
            self._read_all(fd)
        for worker in self._workers:
            if worker.log:
                worker.log.close()
        for fd in self._wake_fds:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)
        self._selector.close()

    def _read(self, fd: int) -> None:
        worker, is_err = self._by_fd[fd]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_fd(fd)
            return
        if worker.log:
            worker.log.write(data)
            worker.log.flush()
        buf = worker.buffers[fd] + data
        *lines, worker.buffers[fd] = buf.split(b"\n")
        if lines:
            self._emit(worker, lines, is_err)

    def _emit(self, worker: Worker, lines: list[bytes], is_err: bool) -> None:
        stream = self.err if is_err else self.out
        chunk = b"".join(worker.prefix + line + b"\n" for line in lines)
        with contextlib.suppress(OSError, ValueError):
            stream.write(chunk)
            stream.flush()
        worker.tail.extend(line.decode("utf-8", "replace") for line in lines)

    def _close_fd(self, fd: int) -> None:
        worker, is_err = self._by_fd.pop(fd)
        rest = worker.buffers.pop(fd, b"")
        if rest:
            self._emit(worker, [rest], is_err)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)
        stream = worker.popen.stderr if is_err else worker.popen.stdout
        if stream is not None:
            stream.close()

    def _read_all(self, fd: int) -> None:
        end = time.monotonic() + 0.5
        while fd in self._by_fd and time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break
            self._read(fd)
        if fd in self._by_fd:
            self._close_fd(fd)
