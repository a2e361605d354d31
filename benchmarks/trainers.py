"""Bring your trainer: steps lost on SIGTERM and kill -9, without and with mlaunch's integration, and
the per-step cost of staging — for the HF ``Trainer``, Lightning, Accelerate and DeepSpeed.

Each framework's example (``examples/<framework>/train.py``, a 2 × 2 CPU job under mlaunch) runs:

1. **faults**, once with ``--without-mlaunch`` (the framework alone: its periodic checkpoint every
   ``--save-every`` steps and its own resume) and once with the integration: kill -9 of rank 3 after
   step ``--kill-at`` (mlaunch restarts the job), then SIGTERM to mlaunch ``--term-after`` steps into
   the restarted job, then a third start to see where it resumes. *Steps lost* by a fault (the
   issue's definition): the newest step every rank finished before it minus the step training begins
   from afterwards.
2. **staging overhead**: one uninterrupted run with the integration (``--step-time 0``); rank 0 reports
   the time its steps took and how much of it was mlaunch's staging (``Session.stage_seconds``: building
   the framework's checkpoint state and copying it to shared memory), so the step time with and without
   staging come from the same run (rank 0's: it stages the model and optimizer, the others their RNG).

Prints a table and writes JSON (``--json``). Needs the trainers venv of ``tests/framework_venvs.py``
(built on first use).

    python benchmarks/trainers.py [--frameworks transformers lightning accelerate deepspeed] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

from bench_env import platform_free_env  # noqa: E402
from trainer_jobs import Run, job_yaml, steps_lost  # noqa: E402

FRAMEWORKS = ("transformers", "lightning", "accelerate", "deepspeed")
TIMING = re.compile(r"\] timing ([\d.]+) (\d+) ([\d.]+) (\d+)$")


def _env() -> dict[str, str]:
    env = platform_free_env()
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    return env


def faults(framework: str, python: Path, work: Path, opts: argparse.Namespace, *, without: bool) -> dict[str, Any]:
    """kill -9 of rank 3, then SIGTERM after the restart: the steps each lost."""
    args = ["--steps", str(opts.steps), "--save-every", str(opts.save_every), "--step-time", str(opts.step_time)]
    args += ["--without-mlaunch"] if without else []
    env = _env()
    run = Run(job_yaml(work, framework, python, args, restarts=1, grace=opts.grace), env)
    try:
        run.wait_step(opts.kill_at, attempt=0)
        run.kill_rank(3, attempt=0)
        restarted = run.wait_start(1)
        run.wait_step(restarted + opts.term_after, attempt=1)
        run.terminate()
        code = run.wait(timeout=300)
    finally:
        run.close()
    after = Run(job_yaml(work, framework, python, args, restarts=0, grace=opts.grace), env)
    try:
        resumed = after.wait_start(0)
        after.terminate()
        after.wait(timeout=300)
    finally:
        after.close()
    hung = any("SIGKILL to" in line and "grace period" in line for line in run.lines)
    return {
        "kill9_at": run.attempts[0].all_finished(),
        "kill9_resumed_from": restarted,
        "kill9_steps_lost": max(steps_lost(run.attempts[0], restarted), 0),
        "sigterm_at": run.attempts[1].all_finished(),
        "sigterm_resumed_from": resumed,
        "sigterm_steps_lost": max(steps_lost(run.attempts[1], resumed), 0),
        "sigterm_exit": code,
        "sigterm_needed_sigkill": hung,
    }


def overhead(framework: str, python: Path, work: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """One uninterrupted run with the integration: step time, and staging's share of it."""
    args = ["--steps", str(opts.overhead_steps), "--save-every", str(10**6), "--step-time", "0"]
    run = Run(job_yaml(work, framework, python, args, restarts=0, grace=opts.grace), _env())
    code = run.wait(timeout=600)
    found = [m for line in run.lines if (m := TIMING.search(line))]
    if code != 0 or not found:
        raise RuntimeError(f"{framework}: the overhead run failed (exit {code})\n{run.tail()}")
    seconds, steps, staging, staged = float(found[-1][1]), int(found[-1][2]), float(found[-1][3]), int(found[-1][4])
    with_ms = 1000 * seconds / steps
    stage_ms = 1000 * staging / max(staged, 1)
    without_ms = with_ms - 1000 * staging / steps
    return {
        "steps": steps,
        "staged_steps": staged,
        "step_ms_with_staging": round(with_ms, 2),
        "step_ms_without_staging": round(without_ms, 2),
        "staging_ms_per_step": round(stage_ms, 2),
        "overhead": round(with_ms / without_ms - 1, 4) if without_ms > 0 else None,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    if any(set(r) != {"without", "with", "overhead"} for r in results.values()):
        return json.dumps(results, indent=2)  # some modes only: no table
    head = "| framework | SIGTERM lost: without / with | kill -9 lost: without / with | step ms (staging) | overhead |"
    lines = [head, "|---|---|---|---|---|"]
    for fw, r in results.items():
        w, m, o = r["without"], r["with"], r["overhead"]
        lines.append(
            f"| {fw} | {w['sigterm_steps_lost']} / {m['sigterm_steps_lost']} | "
            f"{w['kill9_steps_lost']} / {m['kill9_steps_lost']} | "
            f"{o['step_ms_with_staging']} ({o['staging_ms_per_step']}) | {100 * (o['overhead'] or 0):.1f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10, help="the framework's own periodic checkpoint")
    parser.add_argument("--kill-at", type=int, default=13)
    parser.add_argument("--term-after", type=int, default=6)
    parser.add_argument("--step-time", type=float, default=0.3, help="extra seconds per step in the fault runs")
    parser.add_argument("--overhead-steps", type=int, default=40)
    parser.add_argument("--grace", default="15s")
    parser.add_argument(
        "--modes", nargs="+", default=["without", "with", "overhead"], choices=("without", "with", "overhead")
    )
    parser.add_argument("--json", type=Path, default=Path("trainers-benchmark.json"))
    opts = parser.parse_args()
    from framework_venvs import TRAINERS, ensure_venv

    python = ensure_venv(TRAINERS)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mlaunch-trainers-bench-") as tmp:
        for fw in opts.frameworks:
            got: dict[str, Any] = {}
            for mode in opts.modes:
                work = Path(tmp, fw, mode)
                work.mkdir(parents=True)
                if mode == "overhead":
                    got[mode] = overhead(fw, python, work, opts)
                else:
                    got[mode] = faults(fw, python, work, opts, without=mode == "without")
                print(f"{fw} {mode}: {json.dumps(got[mode])}", flush=True)
            results[fw] = got
    print(table(results))
    options = {k: str(v) for k, v in vars(opts).items()}
    opts.json.write_text(json.dumps({"options": options, "results": results}, indent=2))
    print(f"written to {opts.json}")


if __name__ == "__main__":
    main()
