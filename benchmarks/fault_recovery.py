"""Fault recovery: kill -9 of one rank → first training step of the restarted group.

Four DDP processes (gloo, CPU) train; at a random step the benchmark SIGKILLs one random
rank and measures the time until the restarted group's rank 0 prints its first step. The
same worker runs under

- **mlaunch** with ``restart.max_restarts`` and ``preload: [torch, ...]``: the group restarts
  from warm standby processes that already imported torch; the agent-side flash save
  persists the staged step first, and the new group resumes from it;
- **torchrun** ``--max-restarts`` (its defaults: c10d rendezvous, agent store sharing), as
  the baseline measured in the same run.

``--in-process`` runs the worker's training function under ``@elastic.recoverable`` beside the same
worker without it, in the same run: a kill -9 (and, with ``--hangs N``, a SIGSTOP judged after
``monitor.hang_timeout``) → first step, and how many survivors kept their process (their pid is the
same after the fault). Both use job.yaml's restart defaults (no ``backoff:``), as a user would.

A restart *succeeds* when the new group reaches its first step within ``--timeout`` (a failed
one prints the launcher's last error lines); a launcher that exits (restarts exhausted)
counts every remaining kill as failed.
Kills are spaced: the benchmark waits until the group has run a random number of steps and
— for mlaunch — until mlaunch reported its standbys ready (failures minutes apart are the
common case; back-to-back failures fall back to cold starts, which ``--no-wait-standby``
measures).

    python benchmarks/fault_recovery.py                       # 50 mlaunch restarts, 16 torchrun restarts
    python benchmarks/fault_recovery.py --restarts 10 --torchrun-restarts 5
    python benchmarks/fault_recovery.py --in-process --restarts 20 --hangs 5   # in place vs whole restart vs torchrun
    python benchmarks/fault_recovery.py --hosts 2             # 2 netns hosts × 2 ranks: recovery/hosts.py
    python benchmarks/fault_recovery.py --hosts 3 --membership  # a host lost, then back: recovery/membership.py

The worker (what the launchers run) is ``recovery/worker.py``; what the modes share, ``recovery/harness.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.recovery, and launchers from this checkout

from benchmarks.recovery.harness import PID, READY, STEP, WORKER, Launch, base_env, free_port  # noqa: E402


def measure(
    launch: Launch,
    kills: int,
    nproc: int,
    timeout: float,
    wait_ready: bool,
    rng: random.Random,
    fault: int = signal.SIGKILL,
    kept: list[int] | None = None,
    phases: bool = False,
) -> list:
    """Kill (or, ``fault=SIGSTOP``, hang) a random rank ``kills`` times; the recovery seconds (None = failed).

    ``kept`` receives, per fault, how many of the other ranks are the same process after it.
    """
    results: list[float | None] = []
    pids: dict[int, int] = {}
    ready = False
    steps_seen = 0
    target = rng.randint(5, 25)
    deadline = time.monotonic() + timeout * 3  # the first start is cold everywhere
    while len(results) < kills:
        got = launch.next_line(deadline)
        if got is None:  # the launcher died or stalled: every remaining kill failed
            results += [None] * (kills - len(results))
            break
        _, line = got
        line = line.rstrip()
        if m := PID.search(line):
            pids[int(m.group(1))] = int(m.group(2))
        if READY in line:
            ready = True
        if STEP.search(line):
            steps_seen += 1
        if steps_seen >= target and len(pids) == nproc and (ready or not wait_ready):
            victim = rng.randrange(nproc)
            before = dict(pids)
            killed_at = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[victim], fault)
            pids, ready, steps_seen = {}, False, 0
            target = rng.randint(5, 25)
            # the first step line of the new group (a new pid line comes first)
            new_pids = 0
            end = killed_at + timeout
            recovered = None
            while recovered is None:
                got = launch.next_line(end)
                if got is None:
                    break
                when, line = got
                line = line.rstrip()
                if m := PID.search(line):
                    pids[int(m.group(1))] = int(m.group(2))
                    new_pids += 1
                if READY in line:
                    ready = True
                if new_pids and STEP.search(line):
                    recovered = when - killed_at
                    steps_seen = 1
            results.append(recovered)
            if phases and recovered is not None:
                print("    " + phase_times(launch.log_times, killed_at, killed_at + recovered), flush=True)
            if recovered is not None:  # every rank has printed its pid by the first step of the new group
                end = time.monotonic() + 2.0
                while len(pids) < nproc and (got := launch.next_line(end)) is not None:
                    if m := PID.search(got[1].rstrip()):
                        pids[int(m.group(1))] = int(m.group(2))
            same = sum(1 for r, pid in before.items() if r != victim and pids.get(r) == pid)
            if kept is not None:
                kept.append(same)
            status = f"{recovered:.3f}s" if recovered is not None else "FAILED"
            what = "kill" if fault == signal.SIGKILL else "hang"
            print(
                f"  {what} {len(results):2d}/{kills}: rank {victim} → first step after {status}; "
                f"{same}/{nproc - 1} survivors kept their process",
                flush=True,
            )
            if recovered is None:
                tail = [line for line in launch.log[-400:] if "Error" in line or "error" in line][-3:]
                print("    why (last errors): " + (" | ".join(t[:200] for t in tail) or "no error line"), flush=True)
                if launch.proc.poll() is not None:  # the launcher gave up: no later kill can recover
                    print(f"    the launcher exited with {launch.proc.returncode}", flush=True)
                    results += [None] * (kills - len(results))
                    break
            deadline = time.monotonic() + timeout * 3
    return results


PHASES = (
    ("hang judged", "(monitor.hang_timeout)"),
    ("stacks written", "stacks of "),
    ("reaped", "was killed by"),
    ("flash save", "flash save"),
    ("restart said", "restarting the group"),
    ("attempt planned", "(local simulation)  attempt"),
    ("a survivor rejoined", "recovering in place"),
)


MARK = re.compile(r"^(?:\[rank \d+\] )?mark (\w+) (\S+) ([\d.]+)$")  # the worker's own stamps (BENCH_PHASES)


def phase_times(lines: list[tuple[float, str]], start: float, end: float) -> str:
    """Where a recovery's time went: when mlaunch's milestones and the ranks' pid lines arrived after the kill.

    Then, from the workers' own stamps, when the last rank of the new group began its training function
    (``call``), had its process group (``group``), its DDP model (``ddp``) and its state (``loaded``).
    """
    seen: list[str] = []
    pids = 0
    marks: dict[str, float] = {}
    for when, text in lines:
        if (m := MARK.search(text)) and start <= float(m.group(3)) <= end:
            marks[m.group(1)] = max(marks.get(m.group(1), 0.0), float(m.group(3)) - start)
        if when < start or when > end:
            continue
        for name, marker in PHASES:
            if marker in text and not any(s.startswith(name) for s in seen):
                seen.append(f"{name} {when - start:.3f}s")
        if PID.search(text):
            pids += 1
            if pids == 1:
                seen.append(f"first rank's pid {when - start:.3f}s")
            if pids == 4:
                seen.append(f"every rank's pid {when - start:.3f}s")
    if marks:
        seen.append("last rank's " + ", ".join(f"{name} {at:.3f}s" for name, at in marks.items()))
    return "; ".join(seen)


def run_mlaunch(
    args: argparse.Namespace,
    work: Path,
    rng: random.Random,
    *,
    in_process: bool = False,
    fault: int = signal.SIGKILL,
    kills: int | None = None,
    kept: list[int] | None = None,
) -> list:
    job = work / "mlaunch-job.yaml"
    hang = f"monitor: {{hang_timeout: {args.hang_timeout:g}s}}\n" if fault == signal.SIGSTOP else ""
    restart = f"max_restarts: {(kills or args.restarts) + 5}" + ("" if args.defaults else ", backoff: 0s")
    job.write_text(
        f"name: fault-recovery\nentry: {WORKER}\nargs: ['--step-time', '{args.step_time}']\n"
        f"nodes: 1\nprocs_per_node: {args.nproc}\nlog_dir: {work / 'logs'}\n"
        # what the worker imports, and what DDP's constructor imports lazily (torch._dynamo)
        f"preload: [torch, torch.distributed, torch.nn.parallel, torch._dynamo, launchers.elastic]\n"
        f"checkpoint: {{dir: {work / 'ckpt-mlaunch'}, grace_period: 10s}}\n"
        f"restart: {{{restart}}}\n" + hang + "".join(f"{line}\n" for line in args.job_line)
    )
    env = base_env(work / "ckpt-ml")
    if in_process:
        env["BENCH_IN_PROCESS"] = "1"
    if args.phases:
        env["BENCH_PHASES"] = "1"
    launch = Launch([sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)], env)
    try:
        wait = not args.no_wait_standby
        count = kills or args.restarts
        return measure(launch, count, args.nproc, args.timeout, wait, rng, fault, kept, args.phases)
    finally:
        launch.stop()


def run_torchrun(args: argparse.Namespace, work: Path, rng: random.Random, kills: int, fresh_prefix: bool) -> list:
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={args.nproc}",
        f"--max-restarts={kills + 5}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        str(WORKER),
        "--step-time",
        str(args.step_time),
    ]
    env = base_env(work / "ckpt-torchrun")
    if fresh_prefix:
        env["BENCH_FRESH_PREFIX"] = "1"
    launch = Launch(argv, env)
    try:
        return measure(launch, kills, args.nproc, args.timeout, False, rng)
    finally:
        launch.stop()


def summary(name: str, results: list) -> tuple[int, float | None]:
    ok = [r for r in results if r is not None]
    if not ok:
        print(f"{name}: 0/{len(results)} restarts succeeded")
        return 0, None
    med = statistics.median(ok)
    print(
        f"{name}: {len(ok)}/{len(results)} restarts succeeded; kill -9 → first step: median {med:.3f}s, "
        f"min {min(ok):.3f}s, max {max(ok):.3f}s"
    )
    return len(ok), med


def in_process_main(args: argparse.Namespace) -> int:
    """``--in-process``: the same kills (and hangs) in place, as a whole-job restart, and under torchrun."""
    rng = random.Random(args.seed)
    medians: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="fault-recovery-") as tmp:
        work = Path(tmp)
        rows: list[tuple[str, list, list[int]]] = []
        for name, in_process, fault, kills in (
            ("in place, kill -9", True, signal.SIGKILL, args.restarts),
            ("whole restart, kill -9", False, signal.SIGKILL, args.restarts),
            ("in place, hang", True, signal.SIGSTOP, args.hangs),
            ("whole restart, hang", False, signal.SIGSTOP, args.hangs),
        ):
            if not kills:
                continue
            print(f"mlaunch, {name}: {kills} faults of 1 of {args.nproc} ranks", flush=True)
            kept: list[int] = []
            sub = work / name.replace(" ", "-").replace(",", "")
            sub.mkdir()
            results = run_mlaunch(args, sub, rng, in_process=in_process, fault=fault, kills=kills, kept=kept)
            rows.append((name, results, kept))
        torchrun: list = []
        if args.torchrun_restarts:
            print(f"torchrun --max-restarts, fresh store prefix: {args.torchrun_restarts} kills", flush=True)
            torchrun = run_torchrun(args, work, rng, args.torchrun_restarts, True)
    print()
    for name, results, kept in rows:
        _, medians[name] = summary(f"mlaunch, {name}", results)
        if kept:
            print(f"  survivors that kept their process: {sum(kept)}/{len(kept) * (args.nproc - 1)}")
        if "hang" in name and medians[name] is not None:
            print(f"  beyond monitor.hang_timeout ({args.hang_timeout:g}s): {medians[name] - args.hang_timeout:.3f}s")
    if torchrun:
        _, medians["torchrun"] = summary("torchrun (fresh store prefix)", torchrun)
    base = medians.get("whole restart, kill -9")
    fast = medians.get("in place, kill -9")
    if base and fast:
        print(f"  ratio in place / whole restart, kill -9 (median): {fast / base:.2f}")
    if (torchrun_median := medians.get("torchrun")) and fast:
        print(f"  ratio in place / torchrun, kill -9 (median): {fast / torchrun_median:.3f}")
    return 0


def main() -> int:
    # SIGTERM (``timeout``, ``kill``) ends the run through its ``finally`` blocks: the launchers stopped, the netns
    # hosts removed. Its default action left a --hosts run's launchers and ranks training on, orphaned, for an hour.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default 4; --hosts: per host, default 2)")
    parser.add_argument("--restarts", type=int, default=None, help="kills under mlaunch (default 50; --hosts: 20)")
    parser.add_argument(
        "--torchrun-restarts", type=int, default=None, help="kills under torchrun (0: skip; default 16; --hosts: 20)"
    )
    parser.add_argument("--hosts", type=int, default=0, help="network-namespace hosts (recovery/hosts.py)")
    parser.add_argument("--hangs", type=int, default=5, help="--hosts: hangs under mlaunch")
    parser.add_argument("--hang-timeout", type=float, default=3.0, help="--hosts: monitor.hang_timeout, seconds")
    parser.add_argument("--verbose", action="store_true", help="--hosts: the launchers' lines after each fault")
    parser.add_argument(
        "--torchrun-prefix-restarts",
        type=int,
        default=16,
        help="kills under torchrun with a fresh store prefix per restart in the worker (0: skip)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="a restart slower than this failed (default 60 s; --hosts: 120 s)"
    )
    parser.add_argument(
        "--job-line", action="append", default=[], help="a line for mlaunch's job.yaml (e.g. 'preload_fork: false')"
    )
    parser.add_argument("--no-wait-standby", action="store_true", help="kill without waiting for standbys")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument(
        "--membership",
        action="store_true",
        help="--hosts 3: the last host leaves and comes back (recovery/membership.py)",
    )
    parser.add_argument("--cycles", type=int, default=3, help="--membership: leave-and-return cycles")
    parser.add_argument(
        "--in-process", action="store_true", help="@elastic.recoverable beside the whole-job restart (and torchrun)"
    )
    parser.add_argument("--phases", action="store_true", help="per fault: when each milestone of the recovery came")
    parser.add_argument(
        "--defaults", action="store_true", help="job.yaml's restart defaults (no backoff: 0s); --in-process implies it"
    )
    args, _ = parser.parse_known_args()
    from benchmarks.bench_env import compile_sources

    compile_sources()  # off the measured path: no rank compiles what it imports
    if args.hosts and args.membership:
        args.nproc = 2 if args.nproc is None else args.nproc
        args.timeout = 120.0 if args.timeout is None else args.timeout
        from benchmarks.recovery import membership

        return membership.main(args)
    if args.hosts:
        args.nproc = 2 if args.nproc is None else args.nproc  # the 2 hosts × 2 ranks
        args.timeout = 120.0 if args.timeout is None else args.timeout  # torchrun across hosts is slow
        args.restarts = 20 if args.restarts is None else args.restarts
        args.torchrun_restarts = 20 if args.torchrun_restarts is None else args.torchrun_restarts
        args.defaults = args.defaults or args.in_process  # as on one node: what a user gets, no tuned backoff
        from benchmarks.recovery import hosts

        return hosts.main(args)
    args.nproc = 4 if args.nproc is None else args.nproc
    args.timeout = 60.0 if args.timeout is None else args.timeout
    args.restarts = 50 if args.restarts is None else args.restarts
    if args.in_process:
        args.defaults = True
        return in_process_main(args)
    args.torchrun_restarts = 16 if args.torchrun_restarts is None else args.torchrun_restarts
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="fault-recovery-") as tmp:
        work = Path(tmp)
        ml: list = []
        if args.restarts:
            print(f"mlaunch: {args.restarts} kills of 1 of {args.nproc} ranks", flush=True)
            ml = run_mlaunch(args, work, rng)
        tr: list = []
        trp: list = []
        if args.torchrun_restarts:
            print(f"torchrun --max-restarts: {args.torchrun_restarts} kills", flush=True)
            tr = run_torchrun(args, work, rng, args.torchrun_restarts, False)
        if args.torchrun_prefix_restarts:
            print(f"torchrun --max-restarts, fresh store prefix: {args.torchrun_prefix_restarts} kills", flush=True)
            trp = run_torchrun(args, work, rng, args.torchrun_prefix_restarts, True)
    print()
    ml_ok, ml_med = summary("mlaunch (warm standbys)", ml) if ml else (0, None)
    for name, results in (("torchrun --max-restarts", tr), ("torchrun, fresh store prefix per restart", trp)):
        if results:
            _, med = summary(name, results)
            if ml_med and med:
                print(f"  ratio mlaunch / {name} (median): {ml_med / med:.2f}")
    if ml:
        target = ml_ok == len(ml) and ml_med is not None and ml_med <= 0.5
        print(f"targets (median ≤ 0.5 s, {len(ml)}/{len(ml)} succeed): {'met' if target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
