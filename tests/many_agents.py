"""Many real mlaunch agents on this machine: one mlaunch per node, one light rank each, ModelArts-style arguments.

Each node's mlaunch is started as ModelArts starts it (``--init_method tcp://127.0.0.1:PORT
--rank I --world_size N`` appended, ``MA_NUM_GPUS=1``), so node 0's mlaunch hosts the
control plane on 127.0.0.1 and every other one joins it: N real agents, N TCP connections.
The rank is ``scripts/light_rank.py`` (no torch): it marks its start per attempt. Used by
``tests/test_many_agents.py`` and ``benchmarks/real_agents.py`` (which prints the times).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import ROOT, clean_env, mlaunch_cmd

from launchers.config.monitor import CONTROL_PORT_OFFSET
from launchers.platform.cluster import free_port

LIGHT_RANK = ROOT / "tests" / "scripts" / "light_rank.py"
NODE_TIMEOUT = 20.0  # CI found node 0's hub silent for 5.2 s (timeout 5 s), then 10 s (timeout 10 s): see HUB_NICE
# Node 0's mlaunch hosts the hub, which answers all N agents; here it shares two cores with N-1 other mlaunch and
# their ranks. A real node 0 has a machine of its own. Every node is started in a session of its own, and where
# the kernel groups each session for CPU time (``sched_autogroup_enabled``, on on this machine and CI's) a
# process's own nice does nothing against the other sessions: node 0's whole session had 1/128 of two cores
# while the others imported. CI (at the end of its run, not reproduced alone here, even beside 24 CPU hogs) found
# its hub silent for 5.2 s, then 10 s, every node then judging node 0 lost. So node 0's session gets the highest
# CPU weight (its autogroup's nice, and its own where sessions are not grouped): nice -20 weighs 87 other
# sessions, about 40 % of the machine against 127 of them; and the timeout has room (20 s; the test's second
# case waits for it once).
HUB_NICE = -20


@dataclass
class Agents:
    home: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    exited: dict[int, float] = field(default_factory=dict)  # node → time.time() its mlaunch exited
    waited: float = 0.0  # seconds the last ``wait_started`` waited

    @property
    def marks(self) -> Path:
        return self.home / "marks"

    def started(self, attempt: int) -> dict[int, float]:
        """node → wall time its rank of ``attempt`` started."""
        found = {}
        for path in self.marks.glob(f"start-*-{attempt}"):
            found[int(path.name.split("-")[1])] = float(path.read_text())
        return found

    def wait_started(self, attempt: int, timeout: float) -> dict[int, float]:
        """node → start time of its rank of ``attempt``, once every node's has started, an mlaunch has exited,
        or ``timeout`` has passed (``why_not_started`` says which)."""
        begin = time.monotonic()
        while time.monotonic() < begin + timeout and len(self.started(attempt)) < len(self.procs):
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        self.waited = time.monotonic() - begin
        return self.started(attempt)

    def wait_exits(self, timeout: float) -> dict[int, int]:
        """node → exit code, stamping each exit's time as it is seen (every 20 ms)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and len(self.exited) < len(self.procs):
            for node, proc in enumerate(self.procs):
                if node not in self.exited and proc.poll() is not None:
                    self.exited[node] = time.time()
            time.sleep(0.02)
        return {node: proc.returncode for node, proc in enumerate(self.procs) if proc.returncode is not None}

    def why_not_started(self, attempt: int) -> str:
        """Why ``wait_started`` stopped short (the assertion's message): how long it waited and the end of the
        stderr of up to 3 mlaunch that exited (whether or not their rank had started: under load a node that
        gave up says why there), else of up to 3 whose rank of ``attempt`` had not started."""
        started = self.started(attempt)
        exited = [node for node, proc in enumerate(self.procs) if proc.poll() is not None]
        missing = [node for node in range(len(self.procs)) if node not in started]
        lines = [f"waited {self.waited:.1f} s; {len(started)} of {len(self.procs)} started; exited: {exited[:10]}"]
        for node in (exited or missing)[:3]:
            code = self.procs[node].returncode
            lines.append(f"--- node {node} (exit {code}, started {node in started}) ---\n{self.stderr(node)[-800:]}")
        return "\n".join(lines)

    def stderr(self, node: int) -> str:
        return (self.home / f"node-{node}.err").read_text(errors="replace")

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()


def job_port() -> int:
    """A rendezvous port whose control plane port (+ 1000) is free too: node 0 binds that one."""
    while True:
        port = free_port()
        if port + CONTROL_PORT_OFFSET < 65536:
            with contextlib.suppress(OSError), socket.socket() as probe:
                probe.bind(("127.0.0.1", port + CONTROL_PORT_OFFSET))
                return port


def start(home: Path, count: int, port: int, hub_nice: int = 0, **env: str) -> Agents:
    """``count`` mlaunch, one per node, each in its own process group (the test kills what it started);
    ``hub_nice``: node 0's niceness (``HUB_NICE``)."""
    agents = Agents(home)
    agents.marks.mkdir(parents=True)
    job = home / "job.yaml"
    job.write_text(
        f"name: many\nengine: pytorch\nentry: {LIGHT_RANK}\nnodes: {count}\nprocs_per_node: 1\n"
        f"log_dir: {home / 'logs'}\nrestart: {{max_restarts: 1, backoff: 0s}}\n"
        f"monitor: {{node_timeout: {NODE_TIMEOUT:g}s}}\n"
    )
    for node in range(count):
        argv = [*mlaunch_cmd(), "--engine", "pytorch", str(job), "--init_method", f"tcp://127.0.0.1:{port}"]
        argv += ["--rank", str(node), "--world_size", str(count)]
        if node == 0 and hub_nice:  # the hub's node: a real one has its own machine (``HUB_NICE``)
            argv = ["nice", "-n", str(hub_nice), *argv]
        node_env = clean_env(MA_NUM_GPUS="1", MARKS=str(agents.marks), **env)
        with open(home / f"node-{node}.out", "wb") as out, open(home / f"node-{node}.err", "wb") as err:
            agents.procs.append(
                subprocess.Popen(argv, env=node_env, cwd=ROOT, stdout=out, stderr=err, start_new_session=True)
            )
        if node == 0 and hub_nice:  # its session exists: Popen returns once the child has exec'd
            set_session_nice(agents.procs[0].pid, hub_nice)
    return agents


def set_session_nice(pid: int, nice: int) -> None:
    """The CPU weight of ``pid``'s session as a whole, where the kernel groups sessions (``HUB_NICE``)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def leftovers(home: Path) -> list[str]:
    """Processes still running that this harness started: their command line names the job's directory or rank."""
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(home) in cmdline or (str(LIGHT_RANK) in cmdline and _env_has(pid, str(home))):
            left.append(f"{pid}: {cmdline[:120]}")
    return left


def _env_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in (Path("/proc") / pid / "environ").read_bytes()
    except OSError:
        return False
