"""Warm standby workers for fast restarts, mlaunch's side (``launchers.run.standby`` is the other)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from launchers.elastic import staging
from launchers.plan import ProcessSpec
from launchers.run.procs import process_env, reap_unknown, start_process

if TYPE_CHECKING:
    from launchers.run.watchdog import Watchdog

STORE_WAIT_SECONDS = 1.0  # the most a warm rank waits for rank 0's store (see standby.wait_for_listener)


def store_to_wait_for(env: dict[str, str]) -> tuple[str, int] | None:
    """(MASTER_ADDR, MASTER_PORT) for a torch.distributed rank other than 0, else None."""
    host, port, rank = env.get("MASTER_ADDR"), env.get("MASTER_PORT", ""), env.get("RANK", "")
    if not host or not (port + rank).isascii() or not port.isdigit() or not rank.isdigit() or rank == "0":
        return None
    return host, int(port)


@dataclass
class _Standby:
    popen: subprocess.Popen[bytes]
    ready_fd: int
    python: str
    state: Literal["starting", "ready", "dead"] = "starting"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> str:
        """Read the ready pipe without blocking: 'R' → ready, EOF → dead (a preload failed)."""
        if self.state == "starting" and self.ready_fd >= 0:
            try:
                data = os.read(self.ready_fd, 16)
            except BlockingIOError:
                return self.state
            except OSError:
                data = b""
            self.state = "ready" if data.startswith(b"R") else "dead"
            self.close_ready()
        return self.state

    def close_ready(self) -> None:
        if self.ready_fd >= 0:
            os.close(self.ready_fd)
            self.ready_fd = -1


class StandbyPool:
    """Warm standby workers for fast restarts (see ``launchers.run.standby`` for the other side).

    One standby per worker slot, in its own process group with the same parent-death
    signal, ``MLAUNCH_RUN_ID`` and watchdog registration as a worker. Importing torch takes
    seconds of CPU per process, so standbys start only once the attempt's workers are past
    their own start-up: ``delay`` seconds after the attempt began *and* once a rank staged a
    step (``launchers.elastic``) or every worker wrote output — or after ``fallback`` seconds. A
    restart hands each new worker to a standby when its start command is
    ``<python> -u script.py ...`` with the standby's interpreter; anything else starts cold.
    """

    def __init__(self, preload: list[str], *, run_id: str = "", watchdog: Watchdog | None = None, delay: float = 1.0):
        self.preload = list(preload)
        self.run_id = run_id
        self.watchdog = watchdog
        self.delay = delay
        self.standbys: list[_Standby] = []
        self.handed_off = 0
        self.cold_starts = 0
        self.fallback = 30.0
        self._attempt_wall = time.time()

    def new_attempt(self) -> None:
        """An attempt starts now: refill only after its workers show progress."""
        self._attempt_wall = time.time()

    def may_fill(self, elapsed: float, all_spoke: bool = False) -> bool:
        """Whether the attempt's workers are past their start-up (see the class docstring)."""
        if elapsed < self.delay:
            return False
        if elapsed >= self.fallback or all_spoke or not self.run_id:
            return True
        return any(
            slot.complete and slot.stamp >= self._attempt_wall
            for info in staging.read_run(self.run_id)
            for slot in info.slots
        )

    @staticmethod
    def compatible(spec: ProcessSpec) -> bool:
        argv = spec.argv
        return len(argv) >= 3 and argv[1] == "-u" and argv[2].endswith(".py") and spec.role == "worker"

    def pids(self) -> set[int]:
        return {s.pid for s in self.standbys}

    def _alive(self) -> list[_Standby]:
        self.standbys = [s for s in self.standbys if s.poll() != "dead"]
        return self.standbys

    def alive_count(self) -> int:
        return len(self._alive())

    def ready_count(self) -> int:
        return sum(1 for s in self._alive() if s.state == "ready")

    def fill(self, specs: list[ProcessSpec], parent: int) -> int:
        """Start standbys until there is one per compatible spec; returns how many were started."""
        wanted = [s for s in specs if self.compatible(s)]
        started = 0
        for spec in wanted[len(self._alive()) :]:
            standby = self._start(spec, parent)
            if standby is None:
                break
            self.standbys.append(standby)
            if self.watchdog:
                self.watchdog.watch(standby.pid)
            started += 1
        return started

    def _start(self, spec: ProcessSpec, parent: int) -> _Standby | None:
        """One standby with ``spec``'s interpreter, environment and working directory (None: it cannot start)."""
        env = process_env(spec.env, self.run_id)
        read_fd, write_fd = os.pipe()
        env["MLAUNCH_STANDBY_READY_FD"] = str(write_fd)
        argv = [spec.argv[0], "-u", "-m", "launchers.run.standby", *self.preload]
        try:
            popen = start_process(argv, env, spec.cwd, parent, stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except OSError:
            os.close(read_fd)
            return None
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        return _Standby(popen, read_fd, spec.argv[0])

    def take(self, spec: ProcessSpec) -> _Standby | None:
        """A live standby for ``spec`` (ready, or still importing: it is ahead of a cold start)."""
        if not self.compatible(spec):
            return None
        for standby in self._alive():
            if standby.python == spec.argv[0]:
                self.standbys.remove(standby)
                return standby
        return None

    def hand_off(self, standby: _Standby, spec: ProcessSpec, env: dict[str, str]) -> bool:
        """Send the worker's argv/env/cwd; False if the standby could not take it (then kill it)."""
        handed: dict[str, object] = {"argv": spec.argv, "env": env, "cwd": spec.cwd}
        store = store_to_wait_for(env)
        if store is not None:
            handed["wait_for_store"] = [*store, STORE_WAIT_SECONDS]
        payload = json.dumps(handed).encode()
        stdin = standby.popen.stdin
        assert stdin is not None
        try:
            fd = stdin.fileno()
            os.set_blocking(fd, False)
            sent = os.write(fd, payload)
            stdin.close()
            if sent != len(payload):
                raise BlockingIOError("spec larger than the pipe buffer")
        except OSError:
            self._kill(standby)
            return False
        standby.close_ready()
        self.handed_off += 1
        return True

    def _kill(self, standby: _Standby) -> None:
        with contextlib.suppress(OSError):
            os.killpg(standby.pid, signal.SIGKILL)
        if self.watchdog:
            self.watchdog.unwatch(standby.pid)
        standby.close_ready()
        for stream in (standby.popen.stdin, standby.popen.stdout, standby.popen.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def close(self) -> None:
        """Kill every standby that was not handed off (mlaunch is finishing)."""
        for standby in self.standbys:
            self._kill(standby)
        self.standbys = []
        reap_unknown()
