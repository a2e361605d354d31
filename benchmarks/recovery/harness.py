"""What the fault-recovery benchmarks share: the worker's lines, a launcher read line by line, its environment.

``fault_recovery.py`` (one host), ``hosts.py`` (``--hosts 2``), ``membership.py`` (``--hosts 3
--membership``) and ``fault_burst.py`` drive mlaunch (and torchrun) over ``worker.py``; they find
its ranks and steps with ``PID`` and ``STEP``, mlaunch's warm standbys with ``READY``, and print
their figures with ``figures``. Nothing here imports a benchmark: every one of them imports this.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.bench_env import platform_free_env

if TYPE_CHECKING:
    from netns import Host  # tests/netns.py: on sys.path in the benchmarks that make hosts

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "worker.py"  # the training job every launcher runs

PID = re.compile(r"^(?:\[rank \d+\] )?pid (\d+) (\d+)$")  # mlaunch prefixes worker lines, torchrun does not
STEP = re.compile(r"^(?:\[rank \d+\] )?step (\d+)(?: ([\d.]+))?$")
READY = "warm standby workers ready"


class Launch:
    """A launcher process whose combined output is read line by line with arrival times."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.log: list[str] = []
        self.log_times: list[tuple[float, str]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            self.log.append(line.rstrip("\n"))
            self.log_times.append((now, line.rstrip("\n")))
            self.lines.put((now, line))
        self.lines.put((time.monotonic(), ""))

    def next_line(self, deadline: float) -> tuple[float, str] | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            got = self.lines.get(timeout=left)
        except queue.Empty:
            return None
        return None if got[1] == "" else got

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(ckpt: Path) -> dict[str, str]:
    env = platform_free_env()
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", BENCH_CKPT_DIR=str(ckpt), PYTHONUNBUFFERED="1")
    # The workers import launchers.elastic: from this checkout, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def host_env(base: dict[str, str], hosts: list[Host], host: Host, nproc: int) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(("SLURM_", "SKYPILOT_", "JOB_COMPLETION_INDEX"))}
    env.update(GLOO_SOCKET_IFNAME="eth0", MA_NUM_GPUS=str(nproc), MA_NUM_HOSTS=str(len(hosts)))
    env.update(VC_TASK_INDEX=str(host.index), VC_WORKER_HOSTS=",".join(h.name for h in hosts))
    return env


def figures(
    name: str, values: list[float | None], ref: float | None, goal: str = "", against: str = "torchrun's median"
) -> float | None:
    """Print the median, min and max of ``values`` (and the median's ratio to ``ref``); the median."""
    ok = [v for v in values if v is not None]
    if not ok:
        print(f"  {name}: none measured ({len(values)} tried)")
        return None
    med = statistics.median(ok)
    ratio = f" = {med / ref:.3f}× {against}" if ref else ""
    print(f"  {name}: median {med:.3f}s{ratio} (min {min(ok):.3f}s, max {max(ok):.3f}s, n={len(ok)}){goal}")
    return med
