"""What a chaos storm saw (``python -m benchmarks.chaos``): one mlaunch per host, their lines parsed and stamped.

``parse(line)`` is pure: it turns one line of a host's mlaunch output into an ``Event`` (or None).
``Cluster`` starts and stops each host's mlaunch (the ModelArts way: ``--init_method tcp://HOST0
--rank I --world_size N``) and reads their output with arrival stamps (CLOCK_MONOTONIC, one clock
for every network-namespace host); the worker stamps its own step lines on the same clock.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = r"^(?:\[[^\]]*\] )?"
PATTERNS = {
    "pid": re.compile(PREFIX + r"chaos pid (\d+) (\d+)$"),
    "resumed": re.compile(PREFIX + r"chaos resumed (-?\d+) ([\d.]+) (\d+)$"),
    "step": re.compile(PREFIX + r"chaos step (\d+) ([\d.]+)$"),
    "hanging": re.compile(PREFIX + r"chaos hanging (\d+) ([\d.]+)$"),
    "final": re.compile(PREFIX + r"chaos final (-?\d+) (\w+)$"),
    "membership": re.compile(r"^mlaunch: membership \(generation (\d+)\): (\d+) → (\d+) nodes"),
}


@dataclass(frozen=True)
class Event:
    kind: str  # pid | resumed | step | hanging | final | membership
    host: int
    stamp: float  # the worker's own CLOCK_MONOTONIC stamp where it gave one, else the arrival time
    values: tuple[Any, ...]


IN_JOB = re.compile(r"^mlaunch: (engine |node \d+: the job is already running|node \d+: admitted)")


MEMBER = re.compile(r"^mlaunch: (engine |node \d+: admitted)")


def says_in_job(line: str) -> bool:
    """The line says this host's mlaunch is in the job: it starts ranks, or waits as a candidate (towards MIN)."""
    return IN_JOB.search(line) is not None


def says_member(line: str) -> bool:
    """The line says this host's mlaunch is a member: it starts ranks (a candidate says so once admitted)."""
    return MEMBER.search(line) is not None


def parse(host: int, arrival: float, line: str) -> Event | None:
    """The event one output line of host ``host`` carries, if any."""
    for kind, pattern in PATTERNS.items():
        m = pattern.search(line)
        if m is None:
            continue
        if kind == "pid":
            return Event(kind, host, arrival, (int(m[1]), int(m[2])))
        if kind == "resumed":
            return Event(kind, host, float(m[2]), (int(m[1]), int(m[3])))
        if kind in ("step", "hanging"):
            return Event(kind, host, float(m[2]), (int(m[1]),))
        if kind == "final":
            return Event(kind, host, arrival, (int(m[1]), m[2]))
        return Event(kind, host, arrival, (int(m[1]), int(m[2]), int(m[3])))
    return None


@dataclass
class Cluster:
    """One mlaunch per host; every output line with its arrival time and host, also written to per-host logs."""

    hosts: list[Any]  # tests/netns.Host
    job: Path
    base_env: dict[str, str]
    nproc: int
    logs: Path
    procs: dict[int, subprocess.Popen[str]] = field(default_factory=dict)
    lines: queue.Queue[tuple[float, int, str]] = field(default_factory=queue.Queue)
    started: dict[int, list[float]] = field(default_factory=dict)
    in_job: set[int] = field(default_factory=set)  # hosts whose mlaunch said it is a member or waits to be admitted
    members: set[int] = field(default_factory=set)  # of those, the ones that start ranks (admitted: no candidate)

    def env(self, index: int) -> dict[str, str]:
        hosts = self.hosts
        env = dict(self.base_env)
        env.update(GLOO_SOCKET_IFNAME="eth0", MA_NUM_GPUS=str(self.nproc), MA_NUM_HOSTS=str(len(hosts)))
        env.update(VC_TASK_INDEX=str(index), VC_WORKER_HOSTS=",".join(h.name for h in hosts))
        env["MLAUNCH_SHM_DIR"] = str(self.shm_dir(index))
        return env

    def shm_dir(self, index: int) -> Path:
        return Path("/dev/shm") / f"{self.hosts[0].ns.rsplit('-', 1)[0]}-shm-h{index}"

    def start(self, index: int) -> None:
        hosts = self.hosts
        self.shm_dir(index).mkdir(exist_ok=True)
        argv = [sys.executable, "-m", "launchers", "--engine", "pytorch", str(self.job)]
        argv += ["--init_method", f"tcp://{hosts[0].name}:6666", "--rank", str(index), "--world_size", str(len(hosts))]
        log = open(self.logs / f"host{index}.log", "a", buffering=1)  # noqa: SIM115 - closed by the pump
        proc = hosts[index].popen(
            argv, env=self.env(index), cwd=self.job.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.procs[index] = proc
        self.in_job.discard(index)
        self.members.discard(index)
        self.started.setdefault(index, []).append(time.monotonic())
        threading.Thread(target=self._pump, args=(index, proc, log), daemon=True).start()

    def _pump(self, index: int, proc: subprocess.Popen[str], log: Any) -> None:
        assert proc.stdout is not None
        with log:
            for line in proc.stdout:
                now = time.monotonic()
                log.write(f"{now:.3f} {line}")
                self.lines.put((now, index, line.rstrip("\n")))

    def next(self, timeout: float) -> tuple[float, int, str] | None:
        try:
            return self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def running(self, index: int) -> bool:
        proc = self.procs.get(index)
        return proc is not None and proc.poll() is None

    def signal(self, index: int, sig: int) -> bool:
        proc = self.procs.get(index)
        if proc is None or proc.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        return True

    def wait_exit(self, index: int, timeout: float) -> int | None:
        """The exit code of host ``index``'s mlaunch; SIGKILLs its session after ``timeout`` (None then)."""
        proc = self.procs.get(index)
        if proc is None:
            return None
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None

    def stop(self) -> None:
        for index in list(self.procs):
            self.signal(index, signal.SIGTERM)
        for index in list(self.procs):
            self.wait_exit(index, 30)
