"""The watchdog: survives a SIGKILL of mlaunch and cleans up after it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

from launchers.elastic.ipc import completion, kept_segments, progress, staging
from launchers.procs import proc_files
from launchers.run import shm_sweep
from launchers.run.signal_router import FORWARD_SIGNALS
from launchers.stop_signals import STOP_SIGNALS


class Watchdog:
    """A forked helper that kills the job's processes when mlaunch's pipe end closes.

    Forked before any thread exists (fork is cheap, no interpreter start-up). It ignores
    the stop signals (so a Ctrl-C aimed at mlaunch's terminal group does not take it away
    early) and only reads: ``+PGID``/``-PGID`` lines. On EOF — mlaunch exited normally or
    was killed — it SIGKILLs the groups still listed and every process whose environment
    carries this run's marker (grandchildren that escaped into their own session).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.pid = 0
        self._fd = -1

    def start(self) -> Watchdog:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(write_fd)
                for sig in (*STOP_SIGNALS, *FORWARD_SIGNALS):
                    signal.signal(sig, signal.SIG_IGN)
                signal.set_wakeup_fd(-1)
                _watchdog_main(read_fd, self.run_id, os.getppid())
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid = pid
        self._fd = write_fd
        return self

    def _send(self, line: str) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fd, line.encode())

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def unwatch(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def close(self, wait: float = 5.0) -> None:
        """Let the watchdog do its final sweep and exit."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                return
            time.sleep(0.01)


def _watchdog_main(read_fd: int, run_id: str, parent: int) -> None:
    groups: set[int] = set()
    buf = b""
    while True:
        try:
            data = os.read(read_fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    kill_marked_processes(run_id, exclude={os.getpid(), parent})
    staging.unlink_run(run_id)  # shared memory outlives processes: free it whatever happened
    staging.unlink_kept(run_id)
    kept_segments.ended(run_id)
    progress.unlink_run(run_id)
    completion.clear(run_id)
    shm_sweep.unlink_alive(run_id)  # last: until here a sweeper finds this run locked, not dead


def kill_marked_processes(run_id: str, exclude: Iterable[int] = ()) -> list[int]:
    """SIGKILL every process whose initial environment has ``MLAUNCH_RUN_ID=<run_id>``."""
    skip = set(exclude)
    killed: list[int] = []
    for pid in marked_processes(run_id):
        if pid in skip:
            continue
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def marked_processes(run_id: str) -> list[int]:
    """Pids whose initial environment has ``MLAUNCH_RUN_ID=<run_id>`` (processes of other users are not readable).

    Read from /proc/<pid>/environ directly: mlaunch waits for this sweep as it exits, and
    importing psutil for it cost ~15 ms of every job's end. psutil where /proc is missing.
    """
    marker = f"MLAUNCH_RUN_ID={run_id}".encode()
    environs = proc_files("environ")
    if environs is not None:
        return [pid for pid, env in environs if marker in env.split(b"\0")]
    import psutil  # no /proc (another OS)

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("MLAUNCH_RUN_ID") == run_id:
                found.append(proc.pid)
    return found
