"""A third-party trainer restarted fast (issue 13 item 7): Lightning DDP under mlaunch, kill -9 of one rank.

``tests/scripts/lightning_ddp.py`` is a plain Lightning script (CPU, gloo, ``strategy="ddp"``); mlaunch
simulates 2 nodes × 2 ranks and Lightning finds its cluster from the torchrun-style env mlaunch sets
(``TorchElasticEnvironment``). Once the job trains and mlaunch said its warm standbys (``preload:``,
lightning included) are ready, rank 3 is killed with -9. Checked: the restarted job's rank 0 prints its
first step within 5 s of the kill (the step line carries ``time.monotonic()``, one clock with the
test's), and the job finishes with exit 0. Lightning's SIGTERM handler waits in a collective with the
dead peer; without mlaunch's short failure stop (``restart.stop_timeout``) that alone held each restart
for the whole grace period (24-48 s measured in the issue).

Real processes throughout: mlaunch, Lightning, torch.distributed gloo. Slow suite (Lightning's import
and four ranks take tens of seconds on a loaded machine); ``lightning`` comes with the ``test`` extra,
so CI runs it: where CI is set and lightning is missing the test fails rather than skips.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch

pytestmark = [pytest.mark.slow, needs_torch]

SCRIPT = ROOT / "tests" / "scripts" / "lightning_ddp.py"
PID = re.compile(r"^\[node \d+ rank (\d+)\] pid (\d+) (\d+)$")
STEP = re.compile(r"^\[node 0 rank 0\] step (\d+) ([\d.]+)$")
READY = "warm standby workers ready"
RESTART_WITHIN = 5.0


@pytest.fixture(autouse=True)
def _lightning() -> None:
    if importlib.util.find_spec("lightning") is None:
        reason = "lightning is not installed (pip install -e '.[test]' torch==2.13.0 brings it)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the Lightning test: {reason}")
        pytest.skip(reason)


class Output:
    """mlaunch's merged output, line by line, with nothing lost and a deadline per read."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.seen.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(
        self, seen: dict[int, int], ready: list[bool], stop: Callable[[str], object], timeout: float
    ) -> object | None:
        """Read lines (recording pids and readiness) until ``stop(line)`` matches; None at end or timeout."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            if m := PID.match(line):
                seen[int(m.group(1))] = int(m.group(3))
            ready[0] = ready[0] or READY in line
            if found := stop(line):
                return found
        return None

    def text(self) -> str:
        return "\n".join(self.seen[-120:])


def test_lightning_ddp_restarts_within_5s_of_a_kill_9_and_finishes(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: lightning\nengine: pytorch\nentry: {SCRIPT}\n"
        "args: [--steps, '100000', --restart-steps, '60', --step-time, '0.05']\n"
        f"nodes: 2\nprocs_per_node: 2\nlog_dir: {tmp_path / 'logs'}\ncheckpoint: {{dir: {tmp_path / 'ckpt'}}}\n"
        # Lightning's SIGTERM handler waits in a collective with the dead peer and the script stages nothing
        # (no flash save to wait for): the survivors are SIGKILLed after restart.stop_timeout, here 1 s
        # (default 3 s: 2.9-4.2 s to the first restarted step on a loaded machine, close to the 5 s goal)
        "restart: {max_restarts: 2, backoff: 0s, stop_timeout: 1s}\n"
        "preload: [torch, torch.distributed, torch.nn.parallel, torch._dynamo, lightning]\n"
    )
    env = clean_env(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = Output(proc)
    try:
        pids: dict[int, int] = {}
        ready = [False]

        def trained(line: str) -> bool:  # every rank up, standbys ready, a few steps done
            m = STEP.match(line)
            return bool(m and int(m.group(1)) >= 10 and len(pids) == 4 and ready[0])

        assert out.until(pids, ready, trained, 240), f"never trained with standbys ready\n{out.text()}"
        killed_at = time.monotonic()
        os.kill(pids[3], signal.SIGKILL)
        fresh: dict[int, int] = {}

        def restarted_step(line: str) -> re.Match[str] | None:
            return STEP.match(line) if 0 in fresh else None

        first = out.until(fresh, ready, restarted_step, 60)
        assert isinstance(first, re.Match), f"the restarted job never stepped\n{out.text()}"
        took = float(first.group(2)) - killed_at
        assert took <= RESTART_WITHIN, f"first step of the restarted job {took:.2f}s after the kill\n{out.text()}"
        assert proc.wait(timeout=300) == 0, out.text()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)  # the pump has read the last lines
    everything = "\n".join(out.seen)
    assert re.search(r"rank 3 \(pid \d+\) was killed by SIGKILL", everything), out.text()
    assert everything.count("done 60") == 1, out.text()
    print(f"kill -9 of rank 3 → the restarted job's first step after {took:.2f}s")


def test_lightning_under_recoverable_keeps_the_surviving_rank(tmp_path: Path) -> None:
    """Issue 44: the plain Lightning script's ``main`` under ``@elastic.recoverable``, 1 node × 2: rank 1 killed at
    step 10; rank 0 keeps its process (Lightning tears its strategy down and builds a new Trainer in it), rank 1 is
    a new one, the run finishes its 30 steps."""
    job = tmp_path / "job.yaml"
    marker = tmp_path / "killed"
    job.write_text(
        f"entry: {SCRIPT}\nargs: ['--nodes', '1', '--devices', '2', '--steps', '30', '--step-time', '0.02']\n"
        f"engine: pytorch\nnodes: 1\nprocs_per_node: 2\nlog_dir: {tmp_path / 'logs'}\n"
        f"env: {{LIGHTNING_RECOVERABLE: '1', LIGHTNING_KILL_AT: '1:10:{marker}'}}\nrestart: {{max_restarts: 2}}\n"
    )
    result = run_mlaunch(["--engine", "pytorch", str(job)], env=clean_env(), timeout=240)
    out = result.stdout
    assert result.returncode == 0, result.stderr[-3000:]
    assert marker.exists() and "done 30" in out, out[-2000:]
    pids: dict[int, list[str]] = {0: [], 1: []}
    for rank, pid in re.findall(r"\] pid (\d) (\d+)", out):
        pids[int(rank)].append(pid)
    assert len(set(pids[0])) == 1 and len(pids[0]) == 2, pids  # rank 0: the same process, in both attempts
    assert len(set(pids[1])) == 2, pids  # rank 1: a new process
    assert "rank 0 keep their processes and rejoin in place" in result.stderr
