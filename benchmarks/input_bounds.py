"""Bad or huge input is answered in bounded time (issue 15's time goals, out of the unit tests).

``mlaunch plan`` in a subprocess, as a platform node would run it, on:

- a 1 MB job.yaml of long arguments (goal: plans in < 2 s);
- a 1 MB list of tiny values (refused early: more than 50,000 values);
- a simulation of 64 × 1024 ranks (refused at once) and a TensorFlow job needing 4,256 free ports;

each against the baseline of the same run: an empty job (``entry: t.py``) planned the same way.
Printed per case: the median of ``--repeat`` runs, its ratio to the baseline, and whether the
case met its goal (and exited as it must: 0 for the 1 MB job, 2 with the documented message
for the others). The unit tests (``tests/test_strict_inputs.py``) keep the behaviour and only
a hang bound.

    python benchmarks/input_bounds.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_env import platform_free_env

ROOT = Path(__file__).resolve().parent.parent

LONG = "  - --option-with-a-long-name=" + "v" * 200 + "\n"
CASES: list[tuple[str, str, str, int, str, float]] = [
    # (name, engine, job.yaml, expected exit, expected message, goal in seconds)
    ("empty job (baseline)", "pytorch", "entry: t.py\n", 0, "", 0.0),
    ("1 MB of arguments", "pytorch", "entry: t.py\nargs:\n" + LONG * ((1024 * 1024 - 200) // len(LONG)), 0, "", 2.0),
    ("1 MB list of tiny values", "pytorch", "entry: t.py\nargs:\n" + "  - x\n" * 170_000, 2, "more than 50,000", 2.0),
    ("64 x 1024 simulated ranks", "pytorch", "entry: t.py\nnodes: 64\nprocs_per_node: 1024\n", 2, "at most 4096", 5.0),
    (
        "4,256 TensorFlow ports",
        "tensorflow",
        "entry: t.py\nnodes: 4\nprocs_per_node: 1000\ntensorflow: {ps: 64}\n",
        2,
        "needs as many free ports",
        5.0,
    ),
]


def plan_once(engine: str, job: Path) -> tuple[float, int, str]:
    env = platform_free_env()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "launchers", "plan", "--engine", engine, str(job)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return time.perf_counter() - started, done.returncode, done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.py").write_text("print('hi')\n")
        baseline = 0.0
        print(f"{'case':>28}  {'median s':>9}  {'x empty job':>11}  {'goal':>6}  result")
        for name, engine, text, code, message, goal in CASES:
            job = Path(tmp) / "job.yaml"
            job.write_text(text)
            times, outcomes = [], set()
            for _ in range(args.repeat):
                took, got, stderr = plan_once(engine, job)
                times.append(took)
                outcomes.add(got == code and message in stderr and "Traceback" not in stderr)
            med = statistics.median(times)
            baseline = baseline or med
            met = all(outcomes) and (not goal or med < goal)
            ok = ok and met
            goal_text = f"< {goal:g}s" if goal else "-"
            verdict = ("met" if met else "NOT MET") if goal else ("ok" if all(outcomes) else "FAILED")
            print(f"{name:>28}  {med:9.3f}  {med / baseline:10.2f}x  {goal_text:>6}  {verdict}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
