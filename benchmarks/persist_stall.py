"""Training-loop stall per step: ``ckpt.stage()`` alone versus ``ckpt.save()``, at 10 MB and 1 GiB.

With ``checkpoint.persist_every`` a periodic checkpoint costs the loop only ``stage()`` (a
memory copy into the rank's shared-memory segment); mlaunch writes and commits it in the
background. Without it the loop calls ``save()``, which writes, fsyncs and commits the shard
itself. This measures both, in one process (world size 1: ``save()`` without collectives),
with the state as one float32 torch tensor; the checkpoint directory is on the disk
(``--dir``, default a temporary directory under the current one), staging in ``/dev/shm``.

    python benchmarks/persist_stall.py                     # 10 MB and 1 GiB, 5 rounds each
    python benchmarks/persist_stall.py --sizes 10MB --rounds 20
    python benchmarks/persist_stall.py --under-mlaunch      # stage() while mlaunch persists
    python benchmarks/persist_stall.py --dlrover /tmp/dlr   # and DLRover's flash checkpoint, same run

``--under-mlaunch`` runs a one-rank job under mlaunch with ``checkpoint.persist_every`` (every
``--every`` steps) and reports the stall of ``stage()`` in the rank while mlaunch copies and
writes in the background, and how many steps mlaunch committed.

``--dlrover SITE`` also measures DLRover's ``DdpCheckpointer.save_checkpoint`` (memory, and disk
with its background saver) on the same sizes in the same run (``persist_stall_dlrover.py``), with
the ratio of mlaunch's ``stage()`` median to DLRover's memory-save median.

Medians and extremes of the rounds are printed; on a machine shared with other work they
are noisy (say so when quoting them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_env import platform_free_env

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

UNITS = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "KIB": 1024, "MIB": 1 << 20, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    upper = text.strip().upper()
    for unit in sorted(UNITS, key=len, reverse=True):
        if upper.endswith(unit):
            return int(float(upper[: -len(unit)]) * UNITS[unit])
    return int(upper)


def measure(nbytes: int, rounds: int, where: Path) -> dict[str, list[float]]:
    """Seconds per call of stage() and of save() for a state of ``nbytes``."""
    import torch

    from launchers import elastic

    state: dict[str, Any] = {"step": 0, "weights": torch.ones(nbytes // 4, dtype=torch.float32)}
    ckpt = elastic.Checkpointer(str(where / f"ckpt-{nbytes}"), keep=1)
    times: dict[str, list[float]] = {"stage": [], "save": []}
    ckpt.stage(-2, state)  # first use: the segment is created and both slots' pages touched
    ckpt.stage(-1, state)  # (a one-time cost, not a per-step one)
    for step in range(1, rounds + 1):
        state["step"] = step
        state["weights"].add_(1.0)
        started = time.perf_counter()
        assert ckpt.stage(step, state), "staging is off (is MLAUNCH_RUN_ID set?)"
        times["stage"].append(time.perf_counter() - started)
        started = time.perf_counter()
        ckpt.save(step, state)
        times["save"].append(time.perf_counter() - started)
    ckpt.clear()
    return times


def worker(nbytes: int, steps: int, step_time: float) -> None:
    """The rank under mlaunch: a "training step" (sleep), then stage(); prints the stage() times."""
    import torch

    from launchers import elastic

    ckpt = elastic.Checkpointer()
    state: dict[str, Any] = {"step": 0, "weights": torch.ones(nbytes // 4, dtype=torch.float32)}
    ckpt.stage(-2, state)
    ckpt.stage(-1, state)  # both slots touched: the one-time cost is not a step's
    times = []
    for step in range(steps):
        state["step"] = step
        state["weights"].add_(1.0)
        time.sleep(step_time)
        started = time.perf_counter()
        ckpt.stage(step, state)
        times.append(time.perf_counter() - started)
    time.sleep(max(2.0, 4 * step_time))  # the last persist finishes before the job ends
    print("stage-times " + json.dumps(times), flush=True)


def under_mlaunch(nbytes: int, steps: int, every: int, step_time: float, where: Path) -> tuple[list[float], int]:
    """stage() times in a rank while mlaunch persists every ``every`` steps; and how many it committed."""
    job = where / "job.yaml"
    job.write_text(
        f"name: persist-stall\nentry: {HERE}\nargs: ['--worker', '--bytes', '{nbytes}', '--steps', '{steps}', "
        f"'--step-time', '{step_time}']\nnodes: 1\nprocs_per_node: 1\nlog_dir: {where / 'logs'}\n"
        f"checkpoint: {{dir: {where / 'ckpt'}, keep: 2, persist_every: {every}}}\n"
    )
    env = platform_free_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"mlaunch exited {done.returncode}:\n{done.stderr[-3000:]}")
    found = [line for line in done.stdout.splitlines() if "stage-times " in line]
    times = json.loads(found[-1].split("stage-times ", 1)[1])
    return times, done.stderr.count("in the background (")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10MB,1GiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory here)")
    parser.add_argument("--under-mlaunch", action="store_true", help="stage() while mlaunch persists")
    parser.add_argument("--every", type=int, default=2, help="persist_every for --under-mlaunch")
    parser.add_argument("--steps", type=int, default=10, help="steps for --under-mlaunch")
    parser.add_argument("--step-time", type=float, default=None, help="default: 0.05 s per 10 MB, at least 0.05 s")
    parser.add_argument("--dlrover", default=None, help="a directory DLRover is installed in (pip --target)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.bytes, args.steps, args.step_time or 0.05)
        return
    if args.under_mlaunch:
        report_under_mlaunch(args)
        return
    os.environ.setdefault("MLAUNCH_RUN_ID", f"persist-stall-{os.getpid()}")  # staging is on only under mlaunch
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    from launchers.elastic.ipc import progress, staging

    with tempfile.TemporaryDirectory(dir=args.dir or ".") as tmp:
        stage_medians: dict[str, float] = {}
        try:
            print(f"{'size':>8}  {'call':>14}  {'median ms':>10}  {'min ms':>8}  {'max ms':>8}  {'GB/s':>6}")
            for text in args.sizes.split(","):
                nbytes = parse_size(text)
                for call, secs in measure(nbytes, args.rounds, Path(tmp)).items():
                    print_row(text, f"mlaunch {call}", nbytes, secs)
                    if call == "stage":
                        stage_medians[text] = statistics.median(secs)
        finally:  # no mlaunch ran this process: nothing else sweeps what it staged and reported
            staging.unlink_run(os.environ["MLAUNCH_RUN_ID"])
            progress.unlink_run(os.environ["MLAUNCH_RUN_ID"])
        if args.dlrover:
            report_dlrover(args, Path(tmp), stage_medians)


def print_row(size: str, call: str, nbytes: int, secs: list[float], note: str = "") -> None:
    med = statistics.median(secs)
    print(
        f"{size:>8}  {call:>14}  {med * 1e3:10.2f}  {min(secs) * 1e3:8.2f}  {max(secs) * 1e3:8.2f}  "
        f"{nbytes / med / 1e9:6.2f}{note}",
        flush=True,
    )


def report_dlrover(args: argparse.Namespace, where: Path, stage_medians: dict[str, float]) -> None:
    """DLRover's memory and disk saves on the same sizes, in a process of its own (its saver is a daemon)."""
    from launchers.platform.cluster import free_port

    for text in args.sizes.split(","):
        nbytes = parse_size(text)
        # one process per size: DLRover's saver keeps the shared memory of the first state it saw
        done = subprocess.run(
            [
                sys.executable,
                str(HERE.parent / "persist_stall_dlrover.py"),
                args.dlrover,
                str(nbytes),
                str(args.rounds),
                str(where),
                str(free_port()),
            ],
            env={k: v for k, v in os.environ.items() if not k.startswith("MLAUNCH_")},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        found = [line for line in done.stdout.splitlines() if line.startswith("dlrover-times ")]
        if not found:
            print(f"DLRover did not run (exit {done.returncode}):\n{done.stderr[-3000:]}")
            return
        for call, secs in json.loads(found[-1].split(" ", 1)[1])[str(nbytes)].items():
            note = ""
            if call == "memory" and text in stage_medians:
                note = f"  mlaunch stage() / this = {stage_medians[text] / statistics.median(secs):.2f}x"
            print_row(text, f"dlrover {call}", nbytes, secs, note)


def report_under_mlaunch(args: argparse.Namespace) -> None:
    print(f"{'size':>8}  {'step s':>6}  {'stage median ms':>15}  {'max ms':>8}  {'persisted':>9}")
    for text in args.sizes.split(","):
        nbytes = parse_size(text)
        step_time = args.step_time or max(0.05, 0.05 * nbytes / 10e6)
        with tempfile.TemporaryDirectory(dir=args.dir or ".") as tmp:
            times, persisted = under_mlaunch(nbytes, args.steps, args.every, step_time, Path(tmp))
        med = statistics.median(times)
        print(
            f"{text:>8}  {step_time:6.2f}  {med * 1e3:15.2f}  {max(times) * 1e3:8.2f}  "
            f"{persisted:>4} of {args.steps // args.every}",
            flush=True,
        )


if __name__ == "__main__":
    main()
