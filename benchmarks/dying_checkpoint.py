"""Dying checkpoint: time from SIGTERM, and from kill -9 of a worker, to a committed checkpoint.

Two ranks (one node, gloo, CPU) hold a state of the given total size as torch tensors and
stage it to shared memory every step (``Checkpointer.stage``). Then, in separate runs:

- **SIGTERM** to mlaunch: the ranks agree at the next step boundary, write their shards
  from process memory, rank 0 commits (``guard.should_stop`` → ``Checkpointer.save``);
- **kill -9** of one worker: mlaunch's agent-side flash save persists the newest staged step
  from shared memory and commits it.

The clock stops when the commit marker appears (polled every millisecond). For the large
state the same bytes are also copied with ``cp`` (and ``cp`` + ``sync FILE``, which is as
durable as the fsynced checkpoint) from shared memory to the same file system, right after
each run, as the baseline.

End to end, every run allocates its state afresh; in a VM that returns freed memory to the
host, first use of memory is slow and lands on whoever comes first. So the large size is
also measured in steady state (``--persist-rounds``): two processes stage it once and are
stopped, then the agent-side persist (write + fsync + commit) and ``cp`` of the same bytes
alternate, several rounds each.

    python benchmarks/dying_checkpoint.py                      # 10 MB and 1 GiB
    python benchmarks/dying_checkpoint.py --sizes 10MB --runs 5
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_env import platform_free_env

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
NPROC = 2


def worker(total_bytes: int, step_time: float) -> None:
    import torch
    import torch.distributed as dist

    from launchers import elastic

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    guard = elastic.install(quiet=True)
    ckpt = elastic.Checkpointer(keep=1)
    per_rank = total_bytes // world
    state = {"step": 0, "weights": torch.full((per_rank // 4,), float(rank), dtype=torch.float32)}
    step = 0
    while True:
        state["weights"].add_(1.0)  # the "training step"
        state["step"] = step
        ckpt.stage(step, state)
        if step == 1:
            print(f"ready {rank} {os.getpid()}", flush=True)
        if guard.should_stop(step):
            ckpt.save(step, state)
            guard.exit()
        time.sleep(step_time)
        step += 1


def stage_writer(rank: int, total_bytes: int, run_id: str, ckpt: str) -> None:
    """Stage one state into this rank's segment, say so, then wait to be stopped and killed."""
    import torch

    from launchers.elastic.format import shardfile
    from launchers.elastic.ipc import staging

    seg = staging.Segment(staging.segment_path(run_id, rank), rank, NPROC, 0)
    seg.set_target(ckpt, 1)
    state = {"weights": torch.full((total_bytes // NPROC // 4,), float(rank))}
    for step in (1, 2):
        seg.stage(step, shardfile.encode(state))
    print("ready", flush=True)
    time.sleep(3600)


def steady_state(total: int, rounds: int, work: Path) -> list[tuple[str, str, list[float]]]:
    """Interleaved rounds of the agent's persist and cp of the same bytes, memory already in use."""
    from launchers.elastic.format import layout
    from launchers.elastic.ipc import staging
    from launchers.persist import flash_save

    run_id = f"dyingbench{os.getpid()}"
    ckpt = work / "steady-ckpt"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE),
                "--stage-writer",
                str(rank),
                "--bytes",
                str(total),
                "--run-id",
                run_id,
                "--ckpt",
                str(ckpt),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(NPROC)
    ]
    ours: list[float] = []
    cps: list[float] = []
    cp_syncs: list[float] = []
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGSTOP)  # as mlaunch freezes survivors while it copies
        for i in range(rounds):
            shutil.rmtree(ckpt, ignore_errors=True)
            start = time.monotonic()
            result = flash_save.persist(
                run_id,
                attempt=0,
                rank_nodes={r: 0 for r in range(NPROC)},
                nnodes=1,
                key=f"r{i}",
                deadline=time.monotonic() + 300,
            )
            ours.append(time.monotonic() - start)
            assert result.committed, result.message
            cp, cp_sync = cp_baseline(layout.committed(ckpt)[0].path, work)
            cps.append(cp)
            cp_syncs.append(cp_sync)
            print(
                f"  steady state round {i}: persist+commit {ours[-1] * 1000:.0f} ms, cp {cp * 1000:.0f} ms, "
                f"cp+sync {cp_sync * 1000:.0f} ms",
                flush=True,
            )
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        staging.unlink_run(run_id)
    size = f"{total / (1 << 30):g}GiB"
    return [(size, "persist*", ours), (size, "cp*", cps), (size, "cp+sync*", cp_syncs)]


def parse_size(text: str) -> int:
    units = {"kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024, "mib": 1 << 20, "gib": 1 << 30}
    lower = text.lower()
    for unit in sorted(units, key=len, reverse=True):
        if lower.endswith(unit):
            return int(float(lower[: -len(unit)]) * units[unit])
    return int(lower)


def committed(ckpt: Path) -> bool:
    try:
        for entry in os.scandir(ckpt):
            if entry.name.startswith("step_") and os.path.exists(os.path.join(entry.path, "COMMITTED")):
                return True
    except OSError:
        pass
    return False


class Job:
    def __init__(self, work: Path, total: int, step_time: float) -> None:
        self.ckpt = work / "ckpt"
        shutil.rmtree(self.ckpt, ignore_errors=True)
        job = work / "job.yaml"
        job.write_text(
            f"name: dying-checkpoint\nentry: {HERE}\nargs: ['--worker', '--bytes', '{total}', "
            f"'--step-time', '{step_time}']\nnodes: 1\nprocs_per_node: {NPROC}\nlog_dir: {work / 'logs'}\n"
            f"env: {{GLOO_SOCKET_IFNAME: lo}}\ncheckpoint: {{dir: {self.ckpt}, grace_period: 120s, keep: 1}}\n"
        )
        env = platform_free_env()
        # The workers import launchers.elastic: from this checkout, installed or not.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip())
            self.lines.put(line)
        self.lines.put("")  # EOF: mlaunch is gone, nobody will get ready any more

    def wait_ready(self, timeout: float = 300) -> dict[int, int]:
        pids: dict[int, int] = {}
        end = time.monotonic() + timeout
        while len(pids) < NPROC:
            try:
                line = self.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("workers did not get ready:\n" + "\n".join(self.log[-30:])) from None
            if not line:
                raise RuntimeError("mlaunch exited before the workers got ready:\n" + "\n".join(self.log[-30:]))
            parts = line.split()
            if "ready" in parts:
                i = parts.index("ready")
                pids[int(parts[i + 1])] = int(parts[i + 2])
        return pids

    def time_to_commit(self, trigger: str, pids: dict[int, int], timeout: float = 300) -> float:
        start = time.monotonic()
        if trigger == "sigterm":
            self.proc.send_signal(signal.SIGTERM)
        else:
            os.kill(pids[1], signal.SIGKILL)
        while not committed(self.ckpt):
            if time.monotonic() - start > timeout:
                raise RuntimeError("no commit:\n" + "\n".join(self.log[-30:]))
            time.sleep(0.001)
        took = time.monotonic() - start
        self.proc.wait(timeout=timeout)
        return took


def cp_baseline(src_dir: Path, work: Path) -> tuple[float, float]:
    """(cp, cp + sync) seconds to copy the shard bytes from shared memory to the checkpoint's file system.

    The agent's source is shared memory, so the baseline's is too: the committed shard
    files are first copied (untimed) to /dev/shm, then ``cp`` copies them next to the
    checkpoints, as a user would copy a memory snapshot to disk.
    """
    staged = Path(tempfile.mkdtemp(prefix="dying-ckpt-cp-", dir="/dev/shm"))
    try:
        files = []
        for f in sorted(src_dir.glob("rank_*.mlck")):
            shutil.copyfile(f, staged / f.name)
            files.append(staged / f.name)
        results = []
        for durable in (False, True):
            dst = work / f"cp-{int(durable)}"
            shutil.rmtree(dst, ignore_errors=True)
            dst.mkdir()
            start = time.monotonic()
            subprocess.run(["cp", *map(str, files), str(dst)], check=True)
            if durable:
                subprocess.run(["sync", *[str(dst / f.name) for f in files]], check=True)
            results.append(time.monotonic() - start)
            shutil.rmtree(dst)
        return results[0], results[1]
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def warm_up_memory(total: int) -> None:
    """Touch memory and write a scratch file first: in a VM the first use of guest memory is slow,
    and whichever measurement came first would pay for it."""
    scratch = bytearray(total * 3)
    scratch[:: 1 << 12] = b"\1" * len(range(0, len(scratch), 1 << 12))
    del scratch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--step-time", type=float, default=0.01)
    parser.add_argument("--sizes", default="10MB,1GiB", help="total staged state, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="runs per size and trigger")
    parser.add_argument("--triggers", default="sigterm,kill9", help="sigterm, kill9 or both")
    parser.add_argument("--persist-rounds", type=int, default=4, help="steady-state rounds for sizes ≥ 256 MiB")
    parser.add_argument("--stage-writer", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-id", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one under /tmp)")
    args, _ = parser.parse_known_args()
    if args.worker:
        worker(args.bytes, args.step_time)
        return 0
    if args.stage_writer is not None:
        stage_writer(args.stage_writer, args.bytes, args.run_id, args.ckpt)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="dying-ckpt-", dir=args.dir) as tmp:
        work = Path(tmp)
        for size_text in args.sizes.split(","):
            total = parse_size(size_text.strip())
            runs = args.runs if total < (256 << 20) else max(1, min(args.runs, 2))
            if total >= (256 << 20):
                warm_up_memory(total)
            cps: list[float] = []
            cp_syncs: list[float] = []
            for trigger in args.triggers.split(","):
                times = []
                for _ in range(runs):
                    job = Job(work, total, args.step_time)
                    pids = job.wait_ready()
                    times.append(job.time_to_commit(trigger, pids))
                    said = [
                        line.split("mlaunch: ", 1)[-1]
                        for line in job.log
                        if "flash save" in line or "committed" in line
                    ]
                    print(f"  {size_text} {trigger}: {times[-1] * 1000:.1f} ms  ({'; '.join(said)})", flush=True)
                    if total >= (256 << 20):  # the baseline right after, under the same conditions
                        newest = sorted(p for p in (work / "ckpt").glob("step_*") if (p / "COMMITTED").exists())[-1]
                        cp, cp_sync = cp_baseline(newest, work)
                        cps.append(cp)
                        cp_syncs.append(cp_sync)
                        print(f"  {size_text} cp: {cp * 1000:.1f} ms, cp+sync: {cp_sync * 1000:.1f} ms", flush=True)
                rows.append((size_text, trigger, times))
            if cps:
                rows.append((size_text, "cp", cps))
                rows.append((size_text, "cp+sync", cp_syncs))
            if total >= (256 << 20) and args.persist_rounds:
                rows += [(size_text, trig, t) for _, trig, t in steady_state(total, args.persist_rounds, work)]
    print()
    print(f"{'state':>8} {'trigger':>9} {'median':>10} {'min':>10}  (time to a committed checkpoint, {NPROC} ranks)")
    medians: dict[tuple[str, str], float] = {}
    for size_text, trigger, times in rows:
        med = statistics.median(times)
        medians[(size_text, trigger)] = med
        print(f"{size_text:>8} {trigger:>9} {med * 1000:>8.1f}ms {min(times) * 1000:>8.1f}ms")
    for (size_text, trigger), med in medians.items():
        bases = ("cp*", "cp+sync*") if trigger == "persist*" else ("cp", "cp+sync")
        for base in bases:
            if trigger in ("sigterm", "kill9", "persist*") and (size_text, base) in medians:
                print(f"{size_text} {trigger} / {base}: {med / medians[(size_text, base)]:.2f}x")
    if any(t == "persist*" for _, t, _ in rows):
        print("(* steady state: the agent's persist of the staged bytes and cp of the same bytes, alternating)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
