"""A machine lost: steps lost, time to the smaller job's first step, and what replication costs per step.

Root only (it makes 3 network-namespace hosts with ``tests/netns.py``). Every host's ``eth0`` is
shaped with ``tc tbf`` to ``--rate``; one mlaunch per host (ModelArts-style arguments), one rank
each, ``pytorch.nnodes: "2:3"``, ``monitor.node_timeout: 3s``. The job is
``tests/scripts/replica_train.py`` (DDP or FSDP2 over gloo, ``--state-mib`` of parameters and AdamW
moments per rank, every step staged, never saved by the ranks; it prints an exact digest of every
staged state and of the state it resumed with).

Each trial, per mode, runs the job twice — ``checkpoint.replicate: auto`` (DDP: no copy, the
state is replicated; FSDP2: each host streams its newest slot to the next) and ``off`` (the
baseline: what a node loss cost before) — in alternating order, and cuts host 3's link at a
random step (``ip link set eth0 down``). Per run: the newest step rank 0 staged before the cut,
the step the 2-host job resumed from (steps lost = the difference; with ``off`` and no save
the job starts over: every step is lost), whether the resumed state's digest is the one staged
at that step, the seconds from the cut to the 2-host job's first step, and the median step time
before the cut (compute + ``stage()``, the digest excluded) — replication's overhead is the
ratio of the two runs' medians, measured in the same trial.

    python benchmarks/node_loss.py --trials 10 --rate 1gbit --state-mib 64
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from netns import IP, Host, NetnsHosts, netns_unavailable_reason  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "replica_train.py"
STAGED = re.compile(r"staged step (\d+): state-digest (\S+) step-time ([\d.]+)")
RESUMED = re.compile(r"resumed from step (\d+) \(saved by (\d+) ranks, now (\d+)\): state-digest (\d+)")
FRESH = re.compile(r"staged step 0: ")


@dataclass
class Run:
    mode: str
    replicate: str
    cut_at: int
    newest: int = -1  # the newest step rank 0 staged before the 2-host job resumed
    resumed: int | None = None  # None: started over
    same_state: bool | None = None
    recovery_s: float | None = None
    step_times: list[float] = field(default_factory=list)
    said: str = ""
    streamed: str = ""  # node 0's "replication: N step(s) streamed ..." line: bytes per step, steps skipped
    agent_cpu: float | None = None  # CPU seconds of the 3 mlaunch processes per step, until the cut

    @property
    def lost(self) -> int:
        return self.newest - (self.resumed if self.resumed is not None else -1)


class Lines:
    """Every host's mlaunch output, each line with its arrival time (one clock for every namespace)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[float, int, str]] = queue.Queue()
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, host: Host, argv: list[str], env: dict[str, str]) -> None:
        proc = host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        threading.Thread(target=self._pump, args=(host.index, proc), daemon=True).start()

    def _pump(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.queue.put((time.monotonic(), index, line.rstrip("\n")))

    def next(self, deadline: float) -> tuple[float, int, str]:
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                return self.queue.get(timeout=0.2)
        raise TimeoutError("no progress")


def shape(hosts: list[Host], rate: str, qos: bool) -> None:
    """Every host's egress at ``rate`` (``htb``); with ``qos`` the packets marked DSCP CS1 (mlaunch's
    replication stream) go to a class that only borrows what the training's own traffic leaves idle.
    (This kernel has no ``prio`` qdisc; ``htb`` with a ``u32`` match on the TOS byte does the same.)"""
    for host in hosts:
        tc = [IP, "netns", "exec", host.ns, "tc"]
        burst = ["burst", "4mb"]
        steps = [
            ["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10"],
            [
                "class",
                "add",
                "dev",
                "eth0",
                "parent",
                "1:",
                "classid",
                "1:1",
                "htb",
                "rate",
                rate,
                "ceil",
                rate,
                *burst,
            ],
            ["class", "add", "dev", "eth0", "parent", "1:1", "classid", "1:10", "htb", "rate", rate, "ceil", rate]
            + ["prio", "0", *burst],
        ]
        if qos:
            steps.append(["class", "add", "dev", "eth0", "parent", "1:1", "classid", "1:20", "htb", "rate", "1mbit"])
            steps[-1] += ["ceil", rate, "prio", "1", *burst]
            steps.append(["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32"])
            steps[-1] += ["match", "ip", "tos", "0x20", "0xfc", "flowid", "1:20"]
        for step in steps:
            subprocess.run([*tc, *step], check=True, timeout=10, capture_output=True)


def link(host: Host, state: str) -> None:
    subprocess.run([IP, "-n", host.ns, "link", "set", "eth0", state], check=True, timeout=10)


def job_file(work: Path, args: argparse.Namespace, mode: str, replicate: str) -> Path:
    total = args.state_mib * (3 if mode == "fsdp2" else 1)  # --state-mib per rank
    script = f"'--mode', '{mode}', '--steps', '100000', '--state-mib', '{total}', '--width', '{args.width}'"
    job = work / f"{mode}-{replicate}.yaml"
    job.write_text(
        f"name: nodeloss\nengine: pytorch\nentry: {SCRIPT}\nargs: [{script}]\nnodes: 3\nprocs_per_node: 1\n"
        f"log_dir: {work / 'logs'}\ncheckpoint: {{dir: {work / 'ckpt'}, grace_period: 20s, replicate: {replicate}}}\n"
        "restart: {max_restarts: 0}\nmonitor: {node_timeout: 3s}\npytorch: {nnodes: '2:3'}\n"
        "env: {OMP_NUM_THREADS: '1'}\n"
    )
    return job


def one(hosts: list[Host], work: Path, args: argparse.Namespace, run: Run) -> Run:
    """Start the job on the 3 hosts, cut host 3's link at ``run.cut_at``, follow until the 2-host job steps."""
    job = job_file(work, args, run.mode, run.replicate)
    lines = Lines()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MA_", "VC_", "SLURM_"))}
    for host in hosts:
        argv = [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job), "--rank", str(host.index)]
        argv += ["--init_method", f"tcp://{hosts[0].name}:6666", "--world_size", str(len(hosts))]
        extra = {
            "MA_NUM_GPUS": "1",
            "MA_NUM_HOSTS": "3",
            "VC_TASK_INDEX": str(host.index),
            "GLOO_SOCKET_IFNAME": "eth0",
        }
        lines.start(host, argv, {**env, **extra, "VC_WORKER_HOSTS": ",".join(h.name for h in hosts)})
    try:
        follow(lines, hosts, run, time.monotonic() + args.timeout, [p.pid for p in lines.procs])
    finally:
        for proc in lines.procs:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, 9)
            proc.wait()
    return run


def agents_cpu(pids: list[int]) -> float:
    """CPU seconds the mlaunch processes used so far (the netns wrappers exec into them: same pids)."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def follow(lines: Lines, hosts: list[Host], run: Run, deadline: float, pids: list[int]) -> None:
    digests: dict[int, str] = {}
    cut: float | None = None
    base = 0.0
    resumed = False
    while True:
        at, index, line = lines.next(deadline)
        if "node loss" in line and index == 0:
            run.said = line.split("mlaunch: ", 1)[-1][:160]
        if "step(s) streamed to" in line and index == 0 and not run.streamed:
            run.streamed = line.split("replication: ", 1)[-1]
        staged, again = STAGED.search(line), RESUMED.search(line)
        if index != 0 or not (staged or again):
            continue
        if again:
            resumed, run.resumed = True, int(again[1])
            run.same_state = digests.get(run.resumed) == again[4]
        elif staged and cut is not None and (resumed or int(staged[1]) == 0 and digests):
            run.recovery_s = at - cut  # the smaller job's first step (a fresh start when nothing was committed)
            return
        elif staged:
            step = int(staged[1])
            digests[step], run.newest = staged[2], step
            if step >= 3:
                run.step_times.append(float(staged[3]))
            if step == 2:
                base = agents_cpu(pids)
            if step >= run.cut_at and cut is None:
                run.agent_cpu = (agents_cpu(pids) - base) / max(1, step - 2)
                link(hosts[2], "down")
                cut = time.monotonic()


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def report(runs: list[Run], args: argparse.Namespace) -> None:
    qos = "one class" if args.no_qos else "replication in a low-priority class"
    print(f"\n3 netns hosts × 1 rank, links {args.rate} ({qos}), {args.state_mib:g} MiB of state per rank, host 3 cut")
    for run in runs:
        print(
            f"  {run.mode:5} replicate={run.replicate:4} cut at {run.cut_at:3}: newest staged {run.newest}, "
            f"resumed {run.resumed}, lost {run.lost}, same state {run.same_state}, "
            f"first step after {run.recovery_s if run.recovery_s is None else round(run.recovery_s, 2)} s, "
            f"step {median(run.step_times) or 0:.3f} s, mlaunch CPU {run.agent_cpu or 0:.3f} s/step — {run.said}"
        )
        if run.streamed:
            print(f"      streamed: {run.streamed}")
    for mode in args.modes:
        on = [r for r in runs if r.mode == mode and r.replicate == "auto"]
        off = [r for r in runs if r.mode == mode and r.replicate == "off"]
        ok = sum(1 for r in on if r.lost <= 1 and r.same_state)
        ratios = [(median(a.step_times) or 0) / (median(b.step_times) or 1) for a, b in zip(on, off, strict=False)]
        print(
            f"{mode}: replicated — lost ≤ 1 step with the saved state {ok}/{len(on)}, steps lost "
            f"{[r.lost for r in on]}, first step after the cut median {median([r.recovery_s or 0 for r in on]):.2f} s; "
            f"baseline (off) — steps lost {[r.lost for r in off]}, first step after "
            f"{median([r.recovery_s or 0 for r in off]):.2f} s; step time replicated/off "
            f"{statistics.median(ratios) if ratios else float('nan'):.3f} ({', '.join(f'{x:.3f}' for x in ratios)}); "
            f"mlaunch CPU per step (3 hosts) {median([r.agent_cpu or 0 for r in on]) or 0:.3f} s replicated, "
            f"{median([r.agent_cpu or 0 for r in off]) or 0:.3f} s off"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["ddp", "fsdp2"])
    parser.add_argument("--rate", default="1gbit", help="tc tbf rate of every host's eth0")
    parser.add_argument("--state-mib", type=float, default=64.0, help="parameters + AdamW moments per rank")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--no-qos", action="store_true", help="one class per link: replication competes with training")
    parser.add_argument("--cut", default="8:16", help="the link is cut at a random step in MIN:MAX")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    reason = netns_unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    rng = random.Random(args.seed)
    low, high = (int(x) for x in args.cut.split(":"))
    runs: list[Run] = []
    with NetnsHosts(3) as net:
        shape(net.hosts, args.rate, not args.no_qos)
        for trial in range(args.trials):
            for mode in args.modes:
                cut_at = rng.randint(low, high)
                order = ["auto", "off"] if trial % 2 == 0 else ["off", "auto"]
                for replicate in order:
                    work = Path(tempfile.mkdtemp(prefix="node-loss-"))
                    try:
                        runs.append(one(net.hosts, work, args, Run(mode, replicate, cut_at)))
                    except TimeoutError:
                        print(f"  {mode} replicate={replicate}: no progress before the timeout", flush=True)
                    finally:
                        net.kill_all()
                        link(net.hosts[2], "up")
                        shutil.rmtree(work, ignore_errors=True)
                    print(f"  done: {runs[-1] if runs else None}", flush=True)
        report(sorted(runs, key=lambda r: (r.mode, r.replicate)), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
