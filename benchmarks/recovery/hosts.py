"""Fault recovery across hosts (issue 13): 2 network-namespace hosts × 2 ranks, one launcher per host.

Run through ``python benchmarks/fault_recovery.py --hosts 2`` (root: it makes the hosts with
``tests/netns.py``). Each host runs its own launcher the way a cluster starts them, the worker is
``recovery/worker.py`` (gloo over the hosts' ``eth0``, DDP, staged steps):

- **mlaunch**, ModelArts style (``--init_method tcp://HOST0:6666 --rank I --world_size 2``,
  ``MA_NUM_GPUS=2``): node 0's mlaunch hosts the control plane, warm standbys (``preload``),
  ``restart.max_restarts``, ``monitor.hang_timeout``;
- **torchrun**, one per host: ``--nnodes=2``, c10d rendezvous on host 1, ``--max-restarts``; the
  worker puts its gloo keys under a prefix named after the rendezvous round (the same on both
  hosts, new on each restart; torchrun's own restart counts can differ between the hosts; read from
  the rendezvous store), without which torchrun cannot recover at all (its workers' store outlives
  the rounds: the new group reads the old group's gloo addresses).

What is measured (``time.monotonic()`` is one clock for every namespace host of one kernel; the
worker stamps its step lines with it):

- kill -9 of a random rank on a random host → the restarted job's first step (rank 0's step line
  after rank 0's new pid line), for both launchers; a restart succeeds when that step comes within
  ``--timeout``; ratios against torchrun's median of the same run;
- hang: a random rank sleeps forever at the top of a step (its peers block in the next all-reduce)
  → the restarted job's first step (mlaunch only: torchrun has no hang detection); the time
  includes ``monitor.hang_timeout``, also shown less it;
- ``--in-process``: the same faults with the worker under ``@elastic.recoverable`` first, then the
  whole restart, in one run: kill -9 and hang → first step, and how many other ranks kept their
  process (their pid line after the fault names the same pid);
- a kill on host 2 → host 1's launcher reports it (mlaunch's ``job-wide failure`` line), and → every
  rank on host 1 has exited (polled in /proc every 2 ms), for both launchers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.recovery import harness
from benchmarks.recovery.harness import figures, host_env

ROOT = harness.ROOT
sys.path.insert(0, str(ROOT / "tests"))
from netns import Host, NetnsHosts, netns_unavailable_reason  # noqa: E402

NOTICE = re.compile(r"job-wide failure")  # mlaunch on a host that learns of another host's failure
HUNG = re.compile(r"\bhung\b")
HANGING = re.compile(r"^(?:\[rank \d+\] )?hanging (\d+) ([\d.]+)$")
RDZV_PORT = 29400


class Lines:
    """One launcher per host; their stdout+stderr merged, each line with arrival time and host index."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[float, int, str | None]] = queue.Queue()
        self.procs: list[subprocess.Popen[str]] = []
        self.log: list[str] = []
        self.timed: list[tuple[float, str]] = []  # the same lines with their arrival times

    def start(self, host: Host, argv: list[str], env: dict[str, str]) -> None:
        proc = host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        threading.Thread(target=self._pump, args=(host.index, proc), daemon=True).start()

    def _pump(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            self.log.append(f"[host {index + 1}] {line.rstrip()}")
            self.timed.append((now, self.log[-1]))
            self.queue.put((now, index, line.rstrip("\n")))
        self.queue.put((time.monotonic(), index, None))

    def next(self, deadline: float) -> tuple[float, int, str] | None:
        """The next line; None at the deadline or when a launcher's output ended (it exited)."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            when, index, line = self.queue.get(timeout=left)
        except queue.Empty:
            return None
        return None if line is None else (when, index, line)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def alive(pid: int) -> bool:
    """Running (a zombie has exited: it only waits for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class Watcher:
    """When every one of ``pids`` has exited (polled every 2 ms in a thread)."""

    def __init__(self, pids: list[int], timeout: float) -> None:
        self.gone: float | None = None
        self._pids, self._end = pids, time.monotonic() + timeout
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while time.monotonic() < self._end:
            if not any(alive(p) for p in self._pids):
                self.gone = time.monotonic()
                return
            time.sleep(0.002)


@dataclass
class Result:
    kind: str  # "kill" or "hang"
    host: int  # the victim's host (0-based)
    rank: int
    fault: float | None = None  # monotonic time of the kill, or of the hang (the worker's stamp)
    recovered: float | None = None  # fault → the restarted job's first step
    notified: float | None = None  # fault → another host's launcher said so (kills)
    detected: float | None = None  # hang → a launcher declared it hung
    others_stopped: float | None = None  # fault → every rank on the other hosts exited
    kept: int = 0  # the other ranks that are the same process after it (in place: all of them)


@dataclass
class Group:
    """What the current group looks like from its output."""

    pids: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank → (host, pid)
    ready: set[int] = field(default_factory=set)  # hosts whose mlaunch has its standbys ready
    steps: int = 0

    def feed(self, index: int, line: str) -> None:
        if m := harness.PID.search(line):
            self.pids[int(m.group(1))] = (index, int(m.group(2)))
        if harness.READY in line:
            self.ready.add(index)
        if harness.STEP.search(line):
            self.steps += 1


def settle(lines: Lines, group: Group, world: int, hosts: int, wait_ready: bool, timeout: float) -> bool:
    """Run until the group has every rank, a random number of steps and (mlaunch) ready standbys."""
    target = random.randint(5, 25)
    deadline = time.monotonic() + timeout
    while not (group.steps >= target and len(group.pids) == world and (len(group.ready) == hosts or not wait_ready)):
        got = lines.next(deadline)
        if got is None:
            return False
        group.feed(got[1], got[2])
    return True


def follow(lines: Lines, group: Group, result: Result, timeout: float) -> None:
    """Read until the restarted group's rank 0 steps; fill in the times of ``result``."""
    fresh: set[int] = set()
    end = time.monotonic() + timeout
    while True:
        got = lines.next(end)
        if got is None:
            return
        when, index, line = got
        group.feed(index, line)
        if m := harness.PID.search(line):
            fresh.add(int(m.group(1)))
        if (m := HANGING.search(line)) and result.fault is None:
            result.fault = float(m.group(2))
            end = result.fault + timeout
        if result.fault is None:
            continue
        if result.kind == "kill" and index != result.host and result.notified is None and NOTICE.search(line):
            result.notified = when - result.fault
        if result.kind == "hang" and result.detected is None and HUNG.search(line) and not HANGING.search(line):
            result.detected = when - result.fault
        if 0 in fresh and (m := harness.STEP.search(line)):
            stamp = float(m.group(2)) if m.group(2) else when
            result.recovered = stamp - result.fault
            group.steps = 1
            return


def strike(group: Group, kind: str, hosts: int, hang_dir: Path, rng: random.Random) -> tuple[Result, list[int]]:
    """Kill (or make hang) a random rank on a random host; the pids of the other hosts' ranks."""
    host = rng.randrange(hosts)
    rank = rng.choice(sorted(r for r, (h, _) in group.pids.items() if h == host))
    others = [pid for h, pid in group.pids.values() if h != host]
    result = Result(kind, host, rank)
    if kind == "kill":
        result.fault = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(group.pids[rank][1], signal.SIGKILL)
    else:
        (hang_dir / f"hang-{rank}").touch()
    return result, others


def measure(lines: Lines, kinds: list[str], hosts: int, wait_ready: bool, args: argparse.Namespace) -> list[Result]:
    rng = random.Random(args.seed)
    random.seed(args.seed)
    world = hosts * args.nproc
    group = Group()
    results: list[Result] = []
    for i, kind in enumerate(kinds):
        if not settle(lines, group, world, hosts, wait_ready, args.timeout * 3):
            print(f"  the launchers stopped before fault {i + 1}; every remaining one failed; last lines:", flush=True)
            print("    " + "\n    ".join(t[:300] for t in lines.log[-15:]), flush=True)
            results += [Result(k, -1, -1) for k in kinds[i:]]
            break
        before = dict(group.pids)
        result, others = strike(group, kind, hosts, args.hang_dir, rng)
        watcher = Watcher(others, args.timeout)
        group.pids, group.ready = {}, set()
        mark = len(lines.log)
        follow(lines, group, result, args.timeout)
        result.kept = kept_processes(lines, group, before, result.rank, world)
        if result.fault is not None and watcher.gone is not None:
            result.others_stopped = watcher.gone - result.fault
        results.append(result)
        print(f"  {kind} {i + 1}/{len(kinds)}: {describe(result)}", flush=True)
        if args.verbose and result.fault is not None:  # what the launchers said, timed from the fault
            for when, line in lines.timed[mark:]:
                if not harness.STEP.search(line.split("] ", 1)[-1]):
                    print(f"    {when - result.fault:+8.3f}s {line[:200]}", flush=True)
        if result.recovered is None:
            errors = [line for line in lines.log[-400:] if "rror" in line or "failed" in line][-4:]
            print("    why (last errors): " + (" | ".join(t[:200] for t in errors) or "no error line"), flush=True)
    return results


def kept_processes(lines: Lines, group: Group, before: dict[int, tuple[int, int]], victim: int, world: int) -> int:
    """How many ranks other than ``victim`` are the same process in the new group (its pid lines, up to 2 s)."""
    end = time.monotonic() + 2.0
    while len(group.pids) < world and (got := lines.next(end)) is not None:
        group.feed(got[1], got[2])
    return sum(1 for rank, where in before.items() if rank != victim and group.pids.get(rank) == where)


def describe(r: Result) -> str:
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}s"

    where = f"rank {r.rank} on host {r.host + 1}"
    if r.recovered is None:
        return f"{where} → FAILED (no first step of a restarted job)"
    extra = f", hung → declared {s(r.detected)}" if r.kind == "hang" else f", other host notified {s(r.notified)}"
    return (
        f"{where} → first step after {s(r.recovered)}{extra}, other host's ranks exited {s(r.others_stopped)}, "
        f"{r.kept} other ranks kept their process"
    )


def run_mlaunch(args: argparse.Namespace, hosts: list[Host], work: Path, in_process: bool = False) -> list[Result]:
    """mlaunch on every host; ``in_process``: the worker trains under ``@elastic.recoverable`` (``--in-process``)."""
    kinds = ["kill"] * args.restarts + ["hang"] * args.hangs
    random.Random(args.seed + 1).shuffle(kinds)
    job = work / ("mlaunch-in-place.yaml" if in_process else "mlaunch-job.yaml")
    job.write_text(
        f"name: fault-recovery-hosts\nentry: {harness.WORKER}\nargs: ['--step-time', '{args.step_time}']\n"
        f"nodes: {len(hosts)}\nprocs_per_node: {args.nproc}\nlog_dir: {work / 'logs'}\n"
        f"preload: [torch, torch.distributed, torch.nn.parallel, torch._dynamo, launchers.elastic]\n"
        f"checkpoint: {{dir: {work / 'ckpt-mlaunch'}, grace_period: 10s}}\n"
        f"restart: {{max_restarts: {len(kinds) + 5}{'' if args.defaults else ', backoff: 0s'}}}\n"
        f"monitor: {{hang_timeout: {args.hang_timeout}s, node_timeout: 30s}}\n"
    )
    lines = Lines()
    base = harness.base_env(work / "ckpt-mlaunch")
    base["BENCH_HANG_DIR"] = str(args.hang_dir)
    if in_process:
        base["BENCH_IN_PROCESS"] = "1"
    for host in hosts:
        argv = [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)]
        argv += ["--init_method", f"tcp://{hosts[0].name}:6666", "--rank", str(host.index)]
        lines.start(host, [*argv, "--world_size", str(len(hosts))], host_env(base, hosts, host, args.nproc))
    try:
        return measure(lines, kinds, len(hosts), not args.no_wait_standby, args)
    finally:
        lines.stop()


def run_torchrun(args: argparse.Namespace, hosts: list[Host], work: Path) -> list[Result]:
    lines = Lines()
    base = harness.base_env(work / "ckpt-torchrun")
    base.update(BENCH_FRESH_PREFIX="round", BENCH_RDZV_ENDPOINT=f"{hosts[0].name}:{RDZV_PORT}")
    for host in hosts:
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(hosts)}"]
        argv += [f"--nproc-per-node={args.nproc}", f"--max-restarts={args.torchrun_restarts + 5}"]
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={hosts[0].name}:{RDZV_PORT}", "--rdzv-id=bench"]
        argv += [str(harness.WORKER), "--step-time", str(args.step_time)]
        lines.start(host, argv, host_env(base, hosts, host, args.nproc))
    try:
        return measure(lines, ["kill"] * args.torchrun_restarts, len(hosts), False, args)
    finally:
        lines.stop()


def report_in_place(args: argparse.Namespace, inp: list[Result], ml: list[Result], tr: list[Result]) -> None:
    """``--in-process``: in place against the whole restart (and torchrun) of the same run, kills and hangs."""
    ref = figures("torchrun: kill -9 → first step", [r.recovered for r in tr], None) if tr else None
    world_less_one = args.hosts * args.nproc - 1
    for name, results in (("in place", inp), ("whole restart", ml)):
        for kind in ("kill", "hang"):
            done = [r for r in results if r.kind == kind]
            if not done:
                continue
            times = [r.recovered for r in done]
            kept = sum(r.kept for r in done)
            print(f"mlaunch, {name}, {kind}: {sum(t is not None for t in times)}/{len(done)} recovered; "
                  f"{kept}/{world_less_one * len(done)} other ranks kept their process")  # fmt: skip
            if kind == "kill":
                figures(f"{name}: kill -9 → first step", times, ref)
            else:
                less: list[float | None] = [t - args.hang_timeout for t in times if t is not None]
                figures(f"{name}: hang → first step, beyond monitor.hang_timeout {args.hang_timeout:g}s", less, None)


def report(args: argparse.Namespace, ml: list[Result], tr: list[Result]) -> None:
    kills = [r for r in ml if r.kind == "kill"]
    hangs = [r for r in ml if r.kind == "hang"]
    print(f"\n2 hosts × {args.nproc} ranks; times from the fault, CLOCK_MONOTONIC")
    tr_ok = [r.recovered for r in tr if r.recovered is not None]
    print(f"torchrun (c10d, --max-restarts, a store prefix per rendezvous round): {len(tr_ok)}/{len(tr)} restarts")
    ref = figures("kill -9 → first step of the restarted job", [r.recovered for r in tr], None)
    on2 = [r for r in tr if r.host == 1]
    tr_exit = figures("kill on host 2 → every rank on host 1 exited", [r.others_stopped for r in on2], None)
    ml_ok = [r.recovered for r in kills if r.recovered is not None]
    print(f"mlaunch (control plane, warm standbys): {len(ml_ok)}/{len(kills)} restarts after kill -9")
    med = figures("kill -9 → first step of the restarted job", [r.recovered for r in kills], ref)
    on2 = [r for r in kills if r.host == 1]
    figures("kill on host 2 → host 1's mlaunch reports it", [r.notified for r in on2], None, " (goal ≤ 0.2 s)")
    exits = [r.others_stopped for r in on2]
    figures("kill on host 2 → every rank on host 1 exited", exits, tr_exit, " (ratio: against torchrun's same figure)")
    if hangs:
        h_ok = [r.recovered for r in hangs if r.recovered is not None]
        print(f"  hangs: {len(h_ok)}/{len(hangs)} recovered (monitor.hang_timeout {args.hang_timeout}s)")
        figures("hang → declared hung", [r.detected for r in hangs], None)
        figures("hang → first step of the restarted job", [r.recovered for r in hangs], ref)
        less = [v - args.hang_timeout for v in h_ok]
        figures("  the same less hang_timeout", list(less), ref)
    met = len(ml_ok) == len(kills) and med is not None and med <= 1.0 and (ref is None or med <= 0.25 * ref)
    unchecked = " (no torchrun median: the ratio is not checked)" if ref is None else ""
    goal = f"targets (median ≤ 1 s, {len(kills)}/{len(kills)} succeed, ≤ 0.25× torchrun)"
    print(f"{goal}: {'met' if met else 'NOT met'}{unchecked}")


def main(args: argparse.Namespace) -> int:
    reason = netns_unavailable_reason()
    if reason:
        print(f"cannot make network-namespace hosts: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fault-recovery-hosts-") as tmp:
        work = Path(tmp)
        args.hang_dir = work / "hang"
        args.hang_dir.mkdir()
        ml: list[Result] = []
        inp: list[Result] = []
        tr: list[Result] = []
        if args.in_process and (args.restarts or args.hangs):
            print(f"mlaunch, in place (@elastic.recoverable): {args.restarts} kills, {args.hangs} hangs", flush=True)
            with NetnsHosts(args.hosts) as net:
                inp = run_mlaunch(args, net.hosts, work, in_process=True)
        if args.restarts or args.hangs:
            print(f"mlaunch: {args.restarts} kills, {args.hangs} hangs", flush=True)
            with NetnsHosts(args.hosts) as net:
                ml = run_mlaunch(args, net.hosts, work)
        if args.torchrun_restarts:
            print(f"torchrun: {args.torchrun_restarts} kills", flush=True)
            with NetnsHosts(args.hosts) as net:
                tr = run_torchrun(args, net.hosts, work)
    if args.in_process:
        report_in_place(args, inp, ml, tr)
    else:
        report(args, ml, tr)
    return 0
