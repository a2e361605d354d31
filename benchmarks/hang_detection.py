"""How fast a stopped rank is judged hung, against the step time: ``hang_timeout: auto`` vs a fixed one.

One node × ``--nproc`` ranks in lock step over gloo (``tests/scripts/hang_auto.py``); at step
``--stop-step`` rank 1 SIGSTOPs itself (a process stuck in the kernel or a driver looks the same).
For each step time the same job runs twice in this invocation, once with ``hang_timeout: auto``
and once with the fixed ``--fixed`` (the chaos storm's 6 s by default), and the time from the stop
to mlaunch's "hung" line is taken. With ``--slow-steps`` each step time also runs fault-free with
an evaluation and a checkpoint of 10 × a step every 4 steps: whether each setting judged it hung.

    python benchmarks/hang_detection.py --step-times 0.05 0.5 2 --fixed 6
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
from bench_env import platform_free_env  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "hang_auto.py"
HUNG = re.compile(r"rank (\d) \(pid \d+\) hung: ")
LEARNED = re.compile(r"max\((?:\S+ × slowest step ([\d.e+-]+)s|no step measured), floor [^)]*\) = ([\d.]+)s")
STOPS = re.compile(r"rank 1 stops itself at step \d+ at ([\d.]+)")


def run(work: Path, hang_timeout: str, env: dict[str, str], nproc: int, limit: float) -> tuple[float | None, str, int]:
    """One job: seconds from the stop to the hung line (None: not judged), the culprit named, exit code.

    The culprit is "rank N", with auto's learned slowest step and limit when the line gives them.
    """
    job = work / f"job-{hang_timeout}-{time.monotonic_ns()}.yaml"
    job.write_text(
        f"name: hang-bench\nengine: pytorch\nentry: {SCRIPT}\nnodes: 1\nprocs_per_node: {nproc}\n"
        f"log_dir: {work / 'logs'}\nrestart: {{max_restarts: 0}}\nmonitor: {{hang_timeout: {hang_timeout}}}\n"
    )
    base = platform_free_env()
    base.update(env, OUT_DIR=str(work), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)],
        env=base,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    stopped: list[float] = []
    hung: list[tuple[float, str]] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if (m := STOPS.search(line)) and not stopped:
                stopped.append(float(m.group(1)))
            if (h := HUNG.search(line)) and not hung:
                learned = LEARNED.search(line)
                slowest = f"{float(learned.group(1)):.2f} s" if learned and learned.group(1) else "none yet"
                how = f" (slowest {slowest}, limit {float(learned.group(2)):.1f} s)" if learned else ""
                hung.append((time.time(), f"rank {h.group(1)}{how}"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.terminate()
        code = proc.wait(30)
    reader.join(5)
    if not hung:
        return None, "", code
    return (hung[0][0] - stopped[0] if stopped else None), hung[0][1], code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-times", type=float, nargs="+", default=[0.05, 0.5, 2.0])
    parser.add_argument("--fixed", default="6s", help="the fixed hang_timeout to compare with")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--stop-step", type=int, default=8)
    parser.add_argument("--slow-steps", action="store_true", help="also run fault-free with 10 × steps")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hang-bench-") as tmp:
        for step in args.step_times:
            stop = {"STEPS": "100000", "STEP_TIME": str(step), "STOP_RANK": "1", "STOP_STEP": str(args.stop_step)}
            row: dict[str, object] = {"step": step}
            for name in ("auto", args.fixed):
                seconds, culprit, _ = run(Path(tmp), name, stop, args.nproc, 120 + 20 * step)
                row[name] = (seconds, culprit)
            if args.slow_steps:
                fine = {"STEPS": "10", "STEP_TIME": str(step), "SLOW_EVERY": "4", "SLOW_FACTOR": "10"}
                for name in ("auto", args.fixed):
                    _, _, code = run(Path(tmp), name, fine, args.nproc, 120 + 60 * step)
                    row[f"slow-{name}"] = "ok" if code == 0 else f"judged hung (exit {code})"
            rows.append(row)
            print(row, flush=True)
    print(f"\n| step | auto: stop → hung | culprit | {args.fixed}: stop → hung | culprit | auto / {args.fixed} |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        (a, ac), (f, fc) = row["auto"], row[args.fixed]  # type: ignore[misc]
        ratio = f"{a / f:.2f}" if a and f else "-"
        show = lambda v: f"{v:.2f} s" if v is not None else "not judged"  # noqa: E731
        print(f"| {row['step']} s | {show(a)} | {ac} | {show(f)} | {fc} | {ratio} |")
    if args.slow_steps:
        for row in rows:
            print(
                f"step {row['step']} s, fault-free with 10 × steps: auto {row['slow-auto']}, "
                f"{args.fixed} {row[f'slow-{args.fixed}']}"
            )


if __name__ == "__main__":
    main()
