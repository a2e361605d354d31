"""Faults in bursts: wall time lost per kill -9 when several come S seconds apart (issue 26).

One job — 2 simulated nodes × 2 ranks, DDP over gloo on the CPU, ``--step-time`` sleep per step,
every step staged (``launchers.elastic``), a fixed number of steps — is run by mlaunch

- once without faults (the baseline: when each step was done, from mlaunch's start), and
- once per spacing S with K kill -9s of a random rank, S seconds apart, the first ``--warmup``
  seconds after the first step; the job still runs the same number of steps, so

      wall time lost per fault = (step 0 → last step with faults − the same without) / K

with the README's ``preload:`` list and with a short one (``[torch, torch.distributed,
launchers.elastic]``: it lacks ``torch._dynamo``, which the optimizer imports — the warm parent
learns it). ``--today`` also runs each list with ``preload_fork: false`` (each standby imports the
list itself, as before the warm parent) at S = 10, for the comparison. The standbys' memory is
the sum of the proportional set sizes (``Pss`` in /proc/<pid>/smaps_rollup) of every standby
process and the warm parent, sampled in the fault-free run just before the first kill would come.
Each run's baseline is the fault-free run with the same list and mode (same machine, same session).

    python benchmarks/fault_burst.py                        # K=5, S = 3 10 30, both lists, --today
    python benchmarks/fault_burst.py --kills 2 --spacings 10 --lists short --no-today   # a quick look
    python benchmarks/fault_burst.py --worker ...           # (what mlaunch runs)
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks.recovery, and launchers from this checkout

from benchmarks.recovery.harness import Launch, base_env  # noqa: E402

LISTS = {
    "readme": ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "numpy", "launchers.elastic"],
    "short": ["torch", "torch.distributed", "launchers.elastic"],
}
PID = re.compile(r"^(?:\[[^\]]*\] )?pid (\d+) (\d+)$")  # "[node 1 rank 2] pid 2 4711"
STEP = re.compile(r"^(?:\[[^\]]*\] )?step (\d+) ([\d.]+)$")
GOODPUT = re.compile(r"goodput: .*")
STANDBY_CMDS = (b"launchers.standby.warm_parent", b"launchers.standby.standby")


# ----------------------------------------------------------------------------------------
# The worker (run by mlaunch)
# ----------------------------------------------------------------------------------------


def worker(step_time: float, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from launchers import elastic

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.write(1, f"pid {rank} {os.getpid()}\n".encode())
    guard = elastic.install(quiet=True)
    ckpt = elastic.Checkpointer(os.environ["BENCH_CKPT_DIR"], keep=1)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = ckpt.load_latest()
    step = 0
    if state is not None:
        model.module.load_state_dict(state["model"])
        step = int(state["step"]) + 1
    while step < steps:
        opt.zero_grad()
        model(torch.randn(32, 64)).pow(2).mean().backward()
        opt.step()
        if rank == 0:
            os.write(1, f"step {step} {time.monotonic():.6f}\n".encode())
        ckpt.stage(step, {"step": step, "model": model.module.state_dict()})
        if guard.should_stop(step):
            guard.exit()
        time.sleep(step_time)
        step += 1
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one mlaunch run showed: when each step was done, the kills, the standbys' memory."""

    label: str
    step_done: dict[int, float] = field(default_factory=dict)  # step → seconds after mlaunch started (last time)
    kills: list[float] = field(default_factory=list)  # seconds after start
    recoveries: list[float] = field(default_factory=list)  # kill → the new group's first step
    pss_mib: float | None = None
    standbys: int = 0
    exit_code: int | None = None
    said: list[str] = field(default_factory=list)


def write_job(work: Path, name: str, preload: list[str], fork: bool, steps: int, step_time: float) -> Path:
    job = work / f"{name}.yaml"
    job.write_text(
        f"name: fault-burst\nentry: {HERE}\nargs: ['--worker', '--step-time', '{step_time}', '--steps', '{steps}']\n"
        f"nodes: 2\nprocs_per_node: 2\nlog_dir: {work / name / 'logs'}\n"
        f"preload: [{', '.join(preload)}]\npreload_fork: {'true' if fork else 'false'}\n"
        f"checkpoint: {{dir: {work / name / 'ckpt'}, grace_period: 10s}}\n"
        "restart: {max_restarts: 100, backoff: 0s}\n"
    )
    return job


def standby_memory(mlaunch: int, ranks: set[int]) -> tuple[int, float]:
    """(processes, MiB): the standbys and warm parent among mlaunch's children, their summed Pss."""
    count, pss_kib = 0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ranks:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat[stat.rfind(")") + 2 :].split()[1]) != mlaunch:
                continue
            if not any(c in Path(f"/proc/{entry}/cmdline").read_bytes() for c in STANDBY_CMDS):
                continue
            for line in Path(f"/proc/{entry}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss_kib += int(line.split()[1])
                    count += 1
        except (OSError, ValueError, IndexError):
            continue
    return count, pss_kib / 1024


def run_once(args: argparse.Namespace, work: Path, run: Run, job: Path, kills: int, spacing: float) -> Run:
    """Run mlaunch on ``job``; kill ``kills`` times ``spacing`` s apart (0 kills: sample the standbys' memory)."""
    env = base_env(work / run.label / "ckpt")
    env["BENCH_CKPT_DIR"] = str(work / run.label / "ckpt")
    rng = random.Random(args.seed)
    start = time.monotonic()
    launch = Launch([sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)], env)
    pids: dict[int, int] = {}
    next_kill: float | None = None
    stepped_since_kill = True
    killed_at: float | None = None
    try:
        while True:
            got = launch.next_line(time.monotonic() + 0.02)
            now = time.monotonic()
            if got is None and launch.proc.poll() is not None and launch.lines.empty():
                break
            if got is not None:
                when, line = got
                line = line.rstrip()
                if m := PID.search(line):
                    pids[int(m.group(1))] = int(m.group(2))
                elif m := STEP.search(line):
                    run.step_done[int(m.group(1))] = when - start
                    stepped_since_kill = True
                    if killed_at is not None and len(pids) == 4:  # the new group's first step (not the old one's last)
                        run.recoveries.append(when - killed_at)
                        killed_at = None
                    if next_kill is None:
                        next_kill = when + args.warmup
                elif line.startswith("mlaunch: ") and ("preload:" in line or "goodput" in line):
                    run.said.append(line)
            if next_kill is None or now < next_kill:
                continue
            if kills == 0 and run.pss_mib is None:  # the fault-free run: the standbys' memory, warm
                run.standbys, run.pss_mib = standby_memory(launch.proc.pid, set(pids.values()))
                next_kill = float("inf")
            elif len(run.kills) < kills and stepped_since_kill and len(pids) == 4:
                victim = pids[rng.randrange(4)]
                os.kill(victim, signal.SIGKILL)
                killed_at = now
                run.kills.append(now - start)
                pids, stepped_since_kill = {}, False
                next_kill = now + spacing
    finally:
        launch.stop()
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / f"{run.label}.log").write_text("\n".join(launch.log) + "\n")
    run.exit_code = launch.proc.returncode
    return run


# ----------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------


def lost_per_fault(clean: Run, faulty: Run, last: int) -> float | None:
    """From step 0 to step ``last``, with faults less without, per fault.

    Counted from step 0, not from mlaunch's start: the first attempt's cold start (seconds of
    ``import torch`` on a shared machine) varies by more than what is measured here, and no
    fault touches it.
    """
    if last not in faulty.step_done or last not in clean.step_done or 0 not in faulty.step_done or not faulty.kills:
        return None
    with_faults = faulty.step_done[last] - min(faulty.step_done.values())
    without = clean.step_done[last] - min(clean.step_done.values())
    return (with_faults - without) / len(faulty.kills)


def paced_lost_per_fault(clean: Run, faulty: Run, last: int) -> float | None:
    """The same, each run against its own pace: step 0 → ``last`` less ``last`` × its median step interval.

    On a shared machine the pace drifts with other people's load over a run; a uniform slowdown
    then cancels, what the faults cost (downtime, steps done again, slow steps after a restart) stays.
    """

    def overhead(run: Run) -> float | None:
        if any(s not in run.step_done for s in range(last + 1)):
            return None
        times = [run.step_done[s] for s in range(last + 1)]
        intervals = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
        if not intervals:
            return None
        return times[-1] - times[0] - last * statistics.median(intervals)

    with_faults, without = overhead(faulty), overhead(clean)
    if with_faults is None or without is None or not faulty.kills:
        return None
    return (with_faults - without) / len(faulty.kills)


def steps_until(clean: Run, seconds: float) -> int:
    """The step the fault-free run had reached ``seconds`` after its first step (the job for a burst)."""
    first = min(clean.step_done.values())
    return max((s for s, t in clean.step_done.items() if t <= first + seconds), default=max(clean.step_done))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--kills", type=int, default=5, help="K: kill -9s per run")
    parser.add_argument("--spacings", type=float, nargs="+", default=[3.0, 10.0, 30.0], help="S: seconds apart")
    parser.add_argument("--lists", nargs="+", default=["readme", "short"], choices=sorted(LISTS))
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds from the first step to the first kill")
    parser.add_argument("--no-today", dest="today", action="store_false", help="skip preload_fork: false runs")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--keep", type=Path, default=None, help="write each run's mlaunch output to DIR/<run>.log")
    args = parser.parse_args()
    if args.worker:
        worker(args.step_time, args.steps)
        return 0
    print(
        f"fault_burst: 2 nodes × 2 ranks (gloo, CPU), {args.step_time} s steps, K = {args.kills} kill -9s, "
        f"first {args.warmup:g} s after the first step; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="fault-burst-") as tmp:
        work = Path(tmp)
        for name in args.lists:
            modes = [("fork", True, args.spacings)] + ([("today", False, [10.0])] if args.today else [])
            for mode, fork, spacings in modes:
                rows += measure_list(args, work, name, mode, fork, spacings)
    print_table(args, rows)
    return 0


def measure_list(
    args: argparse.Namespace, work: Path, name: str, mode: str, fork: bool, spacings: list[float]
) -> list[tuple]:
    """The fault-free run of one list and mode, then one run per spacing; their table rows."""
    longest = args.warmup + (args.kills - 1) * max(spacings) + 8
    max_steps = int(longest / args.step_time) + 50  # steps take longer than the sleep: enough for any S
    label = f"{name}-{mode}-clean"
    clean = run_once(args, work, Run(label), write_job(work, label, LISTS[name], fork, max_steps, args.step_time), 0, 0)
    print(f"  {label}: {len(clean.step_done)} steps, exit {clean.exit_code}; standbys' Pss {clean.pss_mib}", flush=True)
    rows = []
    for spacing in spacings:
        steps = steps_until(clean, args.warmup + (args.kills - 1) * spacing + 6)
        label = f"{name}-{mode}-S{spacing:g}"
        job = write_job(work, label, LISTS[name], fork, steps + 1, args.step_time)
        faulty = run_once(args, work, Run(label), job, args.kills, spacing)
        lost = lost_per_fault(clean, faulty, steps)
        paced = paced_lost_per_fault(clean, faulty, steps)
        rec = statistics.median(faulty.recoveries) if faulty.recoveries else None
        print(
            f"  {label}: {len(faulty.kills)} kills, exit {faulty.exit_code}, lost/fault "
            f"{'-' if lost is None else f'{lost:.2f} s'} (paced {'-' if paced is None else f'{paced:.2f} s'}), "
            f"kill → first step median {rec and f'{rec:.2f} s'} "
            f"(each: {' '.join(f'{r:.2f}' for r in faulty.recoveries)})",
            flush=True,
        )
        for line in faulty.said:
            print(f"    {line}", flush=True)
        rows.append((name, mode, spacing, len(faulty.kills), lost, paced, rec, clean.pss_mib, clean.standbys))
    return rows


def print_table(args: argparse.Namespace, rows: list[tuple]) -> None:
    print()
    print("list    standbys       S    kills  lost per fault  (paced)  kill → 1st step  standbys' Pss (processes)")
    for name, mode, spacing, kills, lost, paced, rec, pss, count in rows:
        standbys = "warm parent" if mode == "fork" else "own import"
        print(
            f"{name:7s} {standbys:12s} {spacing:4g} s  {kills:5d}  {'-' if lost is None else f'{lost:6.2f} s':>14s}  "
            f"{'-' if paced is None else f'{paced:5.2f} s':>8s}  {'-' if rec is None else f'{rec:.2f} s':>15s}  "
            f"{'-' if pss is None else f'{pss:7.0f} MiB ({count})':>20s}"
        )
    goals = [(2.9, 3.1, 1.0), (9.9, 10.1, 0.5)]
    for low, high, goal in goals:
        hits = [r for r in rows if r[1] == "fork" and low <= r[2] <= high]
        if hits:
            met = all(r[4] is not None and r[4] <= goal and r[3] == args.kills for r in hits)  # wall time
            print(f"goal ≤ {goal:g} s lost per fault at S = {hits[0][2]:g} (every list): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except subprocess.SubprocessError as exc:
        print(f"fault_burst: {exc}", file=sys.stderr)
        sys.exit(1)
