"""Launch overhead: mlaunch vs plain processes vs torchrun, measured in the same run.

A trivial job (gloo init + one all_reduce) with 4 processes, started three ways:
  (a) baseline: 4 plain python processes started directly with the env they need,
  (b) torchrun --standalone --nproc_per_node=4,
  (c) mlaunch, local simulation 1 node × 4.
Runs are interleaved (a, b, c, a, b, c, ...) so machine noise hits all three alike; medians
and ratios are printed. Targets: mlaunch's overhead over (a) ≤ 0.3 s and ≤ 0.1× torchrun's.

    python benchmarks/launch_overhead.py [--repeats 7]
    git worktree add /tmp/before REV && python benchmarks/launch_overhead.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
dist.destroy_process_group()
"""
NPROC = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_plain(script: Path) -> float:
    port = free_port()
    start = time.perf_counter()
    procs = []
    for rank in range(NPROC):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(NPROC),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env))
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * NPROC, codes
    return elapsed


def run_torchrun(script: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}", str(script)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


ROOT = Path(__file__).resolve().parent.parent


def run_mlaunch(job: Path, tree: Path = ROOT) -> float:
    """mlaunch from ``tree`` (this checkout, or another one given with ``--before``)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--before",
        type=Path,
        help="another checkout of mlaunch (git worktree add DIR REV) to run interleaved, as the 'before' figure",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trivial.py"
        script.write_text(JOB)
        job = Path(tmp) / "job.yaml"
        job.write_text(f"entry: {script}\nprocs_per_node: {NPROC}\nlog_dir: {tmp}/logs\n")
        times: dict[str, list[float]] = {"plain": [], "torchrun": [], "mlaunch": []}
        if args.before:
            times["before"] = []
            run_mlaunch(job, args.before)  # its first run writes its bytecode caches
        run_plain(script)  # warm the page cache for torch before measuring
        run_mlaunch(job)
        for i in range(args.repeats):
            times["plain"].append(run_plain(script))
            times["torchrun"].append(run_torchrun(script))
            # the two mlaunch trees alternate who runs first: right after torchrun's teardown is a worse slot
            pair = [("mlaunch", ROOT), ("before", args.before)] if args.before else [("mlaunch", ROOT)]
            for name, tree in pair if i % 2 == 0 else reversed(pair):
                times[name].append(run_mlaunch(job, tree))
    med = {k: statistics.median(v) for k, v in times.items()}
    over_mlaunch = med["mlaunch"] - med["plain"]
    over_torchrun = med["torchrun"] - med["plain"]
    print(f"{NPROC} processes, gloo init + one all_reduce, {args.repeats} interleaved runs each (medians)")
    for name, value in med.items():
        spread = f"min {min(times[name]):.3f} s, max {max(times[name]):.3f} s"
        print(f"  {name:9s} {value:7.3f} s   ({spread})")
    print(f"  mlaunch overhead over plain : {over_mlaunch:+.3f} s   (target ≤ 0.300 s)")
    print(f"  torchrun overhead over plain: {over_torchrun:+.3f} s")
    ratio = over_mlaunch / over_torchrun if over_torchrun > 0 else float("nan")
    print(f"  mlaunch overhead / torchrun overhead = {ratio:.3f}   (target ≤ 0.1)")
    print(
        f"  mlaunch / plain = {med['mlaunch'] / med['plain']:.3f}×   torchrun / plain = "
        f"{med['torchrun'] / med['plain']:.3f}×"
    )
    if args.before:
        over_before = med["before"] - med["plain"]
        print(f"  mlaunch ({args.before}) overhead over plain: {over_before:+.3f} s")
        ratio_before = med["mlaunch"] / med["before"]
        print(f"  this mlaunch / that one: {ratio_before:.3f}×, overhead {over_mlaunch - over_before:+.3f} s")


if __name__ == "__main__":
    main()
