"""Elastic membership across hosts (issue 27): a host lost and back, ``pytorch.nnodes: "2:3"``.

Run through ``python benchmarks/fault_recovery.py --hosts 3 --membership`` (root: it makes the
hosts with ``tests/netns.py``). 3 network-namespace hosts × 2 ranks, one mlaunch per host the
ModelArts way, the worker is ``recovery/worker.py`` (DDP over gloo on the hosts' ``eth0``,
every step staged, ``BENCH_ELASTIC``: it resumes through ``load_latest(into=...)`` and says which
step). ``checkpoint.persist_every`` commits a staged step in the background every few steps;
``elastic.grow: at_checkpoint``; warm standbys (``preload``).

Each cycle, once every rank steps and every host has its standbys ready:

1. host 3's mlaunch is SIGKILLed → the time until the 2-host job's first step (rank 0's first step
   line after its new pid line; the worker stamps lines with CLOCK_MONOTONIC, one clock for every
   namespace host), and the committed steps lost: the newest step committed when the kill came
   less the step the 2-host job resumed from (goal 0);
2. host 3's mlaunch is started again → the time until the 3-host job's first step: it waits as a
   candidate, node 0 re-forms the job once a newer step is committed (every rank stops gracefully),
   and all restart with 3; the wait for that commit is shown apart.

Baseline, measured in the same run: a rank on host 2 killed with -9 (the job restarts at the same
size, the flash save first) → the restarted job's first step. Goal for 1: ≤ ``node_timeout`` + 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.recovery import harness
from benchmarks.recovery.harness import figures as recovery_figures
from benchmarks.recovery.harness import host_env

ROOT = harness.ROOT
sys.path.insert(0, str(ROOT / "tests"))
from netns import Host, NetnsHosts, netns_unavailable_reason  # noqa: E402

from launchers.elastic.format import layout  # noqa: E402

NODE_TIMEOUT = 3.0
PERSIST_EVERY = 10  # staged steps between background commits
RESUMED = re.compile(r"^(?:\[rank \d+\] )?resumed (\d+) ([\d.]+)$")
WAITING = "waits to be admitted"
REGROUP = re.compile(r"wait to join and step (\d+) is committed")


class Hosts:
    """One mlaunch per host (host 3's started again later); every line with its arrival time and host."""

    def __init__(self, hosts: list[Host], job: Path, base: dict[str, str], nproc: int) -> None:
        self.hosts, self.job, self.base, self.nproc = hosts, job, base, nproc
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.queue: queue.Queue[tuple[float, int, str]] = queue.Queue()
        self.log: list[str] = []
        self.timed: list[tuple[float, str]] = []

    def start(self, index: int) -> None:
        hosts = self.hosts
        argv = [sys.executable, "-m", "launchers", "--engine", "pytorch", str(self.job)]
        argv += ["--init_method", f"tcp://{hosts[0].name}:6666", "--rank", str(index), "--world_size", str(len(hosts))]
        env = host_env(self.base, hosts, hosts[index], self.nproc)
        proc = hosts[index].popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs[index] = proc
        threading.Thread(target=self._pump, args=(index, proc), daemon=True).start()

    def _pump(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.queue.put((time.monotonic(), index, line.rstrip("\n")))

    def next(self, deadline: float) -> tuple[float, int, str] | None:
        try:
            got = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        self.log.append(f"[host {got[1] + 1}] {got[2]}")
        self.timed.append((got[0], self.log[-1]))
        return got

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@dataclass
class Cycle:
    shrink: float | None = None  # host 3's mlaunch killed → the 2-host job's first step
    lost: int | None = None  # committed steps lost by the shrink
    grow: float | None = None  # host 3 started again → the 3-host job's first step
    commit_wait: float | None = None  # of which: until node 0 re-formed the job (a newer commit)
    baseline: float | None = None  # a rank's kill -9 → the restarted job's first step (same size)


class Group:
    """The running group as its output shows it: ranks' pids, hosts with standbys ready, steps."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.pids: dict[int, tuple[int, int]] = {}
        self.ready: set[int] = set()
        self.steps = 0
        self.resumed: int | None = None

    def feed(self, index: int, line: str) -> None:
        if m := harness.PID.search(line):
            self.pids[int(m.group(1))] = (index, int(m.group(2)))
        if harness.READY in line:
            self.ready.add(index)
        if harness.STEP.search(line):
            self.steps += 1
        if m := RESUMED.search(line):
            self.resumed = int(m.group(1))

    def settle(self, world: int, hosts: int, timeout: float) -> bool:
        """Every rank steps (at least 15 steps) and every host has its standbys ready."""
        deadline = time.monotonic() + timeout
        self.steps = 0
        while not (self.steps >= 15 and len(self.pids) == world and len(self.ready) >= hosts):
            got = self.hosts.next(deadline)
            if got is None:
                return False
            self.feed(got[1], got[2])
        return True

    def first_step(self, since: float, timeout: float, mark: re.Pattern[str] | None = None) -> tuple[float, float]:
        """(first step's stamp − since, when ``mark`` was seen − since) of the group that starts next."""
        self.pids, self.ready, self.resumed = {}, set(), None
        fresh, marked = False, None
        deadline = time.monotonic() + timeout
        while (got := self.hosts.next(deadline)) is not None:
            when, index, line = got
            self.feed(index, line)
            if mark is not None and marked is None and mark.search(line):
                marked = when - since
            if harness.PID.search(line) and 0 in self.pids:
                fresh = True
            if fresh and (m := harness.STEP.search(line)):
                return (float(m.group(2)) if m.group(2) else when) - since, marked if marked is not None else -1.0
        raise TimeoutError("no first step of a new group")


def newest_committed(ckpt: Path) -> int:
    step = layout.newest_step(ckpt)
    return -1 if step is None else step


def cycle(hosts: Hosts, group: Group, ckpt: Path, args: argparse.Namespace) -> Cycle:
    result = Cycle()
    world = 3 * args.nproc
    if not group.settle(world, 3, args.timeout):
        return result
    victim = group.pids[args.nproc][1]  # a rank on host 2: the same-size restart, as a baseline
    began = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    result.baseline, _ = group.first_step(began, args.timeout)
    if not group.settle(world, 3, args.timeout):
        return result
    committed = newest_committed(ckpt)
    began = time.monotonic()
    hosts.procs[2].kill()  # host 3's mlaunch (its ranks die with it)
    result.shrink, _ = group.first_step(began, args.timeout)
    if group.resumed is not None:
        result.lost = max(0, committed - group.resumed)
    group.settle(2 * args.nproc, 2, args.timeout)
    began = time.monotonic()
    mark = len(hosts.timed)
    hosts.start(2)  # the platform restarted host 3's pod
    result.grow, result.commit_wait = group.first_step(began, args.timeout, REGROUP)
    if args.verbose:  # what the launchers said while host 3 came back, timed from its start
        for when, line in hosts.timed[mark:]:
            if not harness.STEP.search(line.split("] ", 1)[-1]):
                print(f"    {when - began:+8.3f}s {line[:160]}", flush=True)
    return result


def figures(name: str, values: list[float | None], ref: float | None = None, goal: str = "") -> float | None:
    return recovery_figures(name, values, ref, goal, against="the baseline")


def report(args: argparse.Namespace, cycles: list[Cycle]) -> None:
    shape = f"3 hosts × {args.nproc} ranks, pytorch.nnodes '2:3', monitor.node_timeout {NODE_TIMEOUT:g}s"
    print(f"\n{shape}, checkpoint.persist_every {PERSIST_EVERY}, step time {args.step_time:g}s; CLOCK_MONOTONIC")
    ref = figures(
        "baseline: kill -9 of a rank on host 2 → first step of the same-size job", [c.baseline for c in cycles]
    )
    goal = NODE_TIMEOUT + 2.0
    shrink = figures(
        "host 3's mlaunch SIGKILLed → first step of the 2-host job",
        [c.shrink for c in cycles],
        ref,
        f" (goal ≤ {goal:g}s)",
    )
    lost = [c.lost for c in cycles]
    print(f"  committed steps lost by the shrink: {lost} (goal 0 each)")
    figures("host 3 started again → first step of the 3-host job", [c.grow for c in cycles], ref)
    figures("  of which: until node 0 re-formed the job (a newer commit)", [c.commit_wait for c in cycles])
    met = shrink is not None and shrink <= goal and all(x == 0 for x in lost) and len(lost) == args.cycles
    said = "met" if met else "NOT met"
    print(f"targets (shrink median ≤ {goal:g}s, 0 committed steps lost, {args.cycles} cycles): {said}")


def main(args: argparse.Namespace) -> int:
    reason = netns_unavailable_reason()
    if reason:
        print(f"cannot make network-namespace hosts: {reason}", file=sys.stderr)
        return 2
    keep = os.environ.get("BENCH_KEEP")  # a directory: the run's logs and events stay there
    with tempfile.TemporaryDirectory(prefix="membership-hosts-") as tmp, NetnsHosts(3) as net:
        work = Path(keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        ckpt = work / "ckpt"
        job = work / "job.yaml"
        job.write_text(
            f"name: membership-hosts\nentry: {harness.WORKER}\nargs: ['--step-time', '{args.step_time}']\n"
            f"nodes: 3\nprocs_per_node: {args.nproc}\nlog_dir: {work / 'logs'}\n"
            "preload: [torch, torch.distributed, torch.nn.parallel, torch._dynamo, launchers.elastic]\n"
            f"checkpoint: {{dir: {ckpt}, grace_period: 10s, persist_every: {PERSIST_EVERY}}}\n"
            f"restart: {{max_restarts: {4 * args.cycles + 5}, backoff: 0s}}\n"
            f"monitor: {{node_timeout: {NODE_TIMEOUT:g}s}}\n"
            "pytorch: {nnodes: '2:3'}\nelastic: {grow: at_checkpoint}\n"
        )
        base = harness.base_env(ckpt)
        base["BENCH_ELASTIC"] = "1"
        hosts = Hosts(net.hosts, job, base, args.nproc)
        cycles: list[Cycle] = []
        try:
            for index in range(3):
                hosts.start(index)
            group = Group(hosts)
            for i in range(args.cycles):
                try:
                    cycles.append(cycle(hosts, group, ckpt, args))
                except TimeoutError as exc:
                    cycles.append(Cycle())
                    print(f"  cycle {i + 1}: {exc}; last lines:\n    " + "\n    ".join(hosts.log[-20:]), flush=True)
                    break
                print(f"  cycle {i + 1}/{args.cycles}: {cycles[-1]}", flush=True)
        finally:
            hosts.stop()
    report(args, cycles)
    return 0
