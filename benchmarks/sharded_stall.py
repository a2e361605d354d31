"""Sharded (FSDP2) checkpoints: the training stall, the kill -9 commit and the resharding load, against DCP.

One run, one FSDP2 state (``--gib`` of parameters + AdamW moments, over 4 ranks: 2 nodes × 2
simulated by mlaunch, gloo on CPU):

1. **Stall per checkpoint** while training: the same steps with a checkpoint every ``--every``
   steps by ``Checkpointer.stage`` (shared memory, for mlaunch's flash save),
   ``dcp.async_save`` in thread and in process mode, ``dcp.save`` (both to DCP's
   ``FileSystemWriter``), and the two synchronous saves into mlaunch's layout:
   ``Checkpointer.save`` (its own protocol) and ``dcp.save`` through DCP's planner into
   ``MlaunchStorageWriter`` (what ``save`` would be, built on DCP's planner/storage split).
   Each against the same steps without checkpoints measured in the same processes just
   before: per checkpoint, the extra time of the steps from one checkpoint to the next
   (median over checkpoints) — the blocking call, and what a background write takes from
   the steps after it (CPU, memory bandwidth, the GIL). The time inside the call is printed
   beside it. A step is a fixed amount of compute per rank (``--step fsdp2``: FSDP2's own
   forward/backward/AdamW, whose gloo all-gathers vary by seconds on a small shared machine).
2. **kill -9 → committed checkpoint**: a rank is SIGKILLed while the ranks stage every step;
   the clock runs until mlaunch's flash save has committed the staged step (its marker), then
   ``cp`` + ``sync`` copies the same bytes from shared memory to the same file system.
3. **Resharding load**: 2 ranks load the 4-rank checkpoint — mlaunch's flash-saved one with
   ``Checkpointer.load_latest(into=...)``, DCP's own (from step 1) with ``dcp.load`` — in turn,
   the page cache dropped before each load where this machine allows it.

Goals (issue 23): stage() stall ≤ async_save's; kill -9 commit ≤ 1.2× cp+sync; resharding
load ≤ 1.2× dcp.load.

    python benchmarks/sharded_stall.py [--gib 1.0] [--steps 12] [--every 3] [--dir /work]
"""

from __future__ import annotations

import argparse
import json
import os
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
from dying_checkpoint import committed, cp_baseline

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
WIDTH = 2048


# ---------------------------------------------------------------------------------------------
# The ranks (run by mlaunch as this file with --worker)
# ---------------------------------------------------------------------------------------------


def build(gib: float):  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    layers = max(1, round(gib * (1 << 30) / 12 / (WIDTH * WIDTH)))  # fp32 weights + two AdamW moments
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def state(model, opt):  # type: ignore[no-untyped-def]
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


STEP = {"kind": "compute"}  # set by --step


def train_step(model, opt) -> None:  # type: ignore[no-untyped-def]
    """One step: FSDP2's forward/backward/AdamW (``--step fsdp2``), or a fixed amount of compute per rank.

    The fixed step (the default) is what makes a stall measurable on a small shared machine: FSDP2's
    all-gathers over gloo vary by seconds from step to step there, more than any checkpoint costs.
    """
    import torch

    if STEP["kind"] == "fsdp2":
        model(torch.randn(4, WIDTH)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        return
    a = STEP.setdefault("a", torch.randn(384, 384))  # type: ignore[arg-type]
    for _ in range(40):
        a = torch.tanh(a @ a * 1e-3)


def run_steps(model, opt, steps: int, every: int, save) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Each step's wall time (the checkpoint call included where there is one) and each call's own time.

    Every step starts at a barrier, so a step's time is the slowest rank's.
    """
    import torch.distributed as dist

    times, calls = [], []
    for step in range(steps):
        dist.barrier()
        start = time.perf_counter()
        train_step(model, opt)
        if save is not None and (step + 1) % every == 0:
            t0 = time.perf_counter()
            save(step)
            calls.append(time.perf_counter() - t0)
        dist.barrier()
        times.append(time.perf_counter() - start)
    return times, calls


def stall_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    from launchers import elastic
    from launchers.elastic.pytorch import MlaunchStorageWriter

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    STEP["kind"] = args.step
    model, opt = build(args.gib)
    ckpt = elastic.Checkpointer(args.ckpt, keep=1)
    saver = elastic.Checkpointer(args.ckpt + "-save", keep=1)  # its own directory: the kill phase times ckpt's
    pending: list = []
    # async_save's own group: its background collectives must not interleave with training's on the default one
    background = dist.new_group(backend="gloo")

    def async_save(kind):  # type: ignore[no-untyped-def]
        def save(step: int) -> None:
            if pending:
                pending.pop().result()  # DCP's rule: one async save in flight
            target = f"{args.dcp}/async-{kind.name.lower()}"
            pending.append(
                dcp.async_save(
                    state(model, opt), checkpoint_id=target, async_checkpointer_type=kind, process_group=background
                )
            )

        return save

    methods = {
        "stage()": lambda step: ckpt.stage(step, state(model, opt)),
        "async_save thread": async_save(AsyncCheckpointerType.THREAD),
        "async_save process": async_save(AsyncCheckpointerType.PROCESS),
        "dcp.save": lambda step: dcp.save(state(model, opt), checkpoint_id=f"{args.dcp}/sync"),
        # the synchronous saves into mlaunch's layout: the bespoke protocol and DCP's planner + our writer
        "save()": lambda step: saver.save(step, state(model, opt)),
        "dcp.save(ours)": lambda step: dcp.save(
            state(model, opt), storage_writer=MlaunchStorageWriter(args.ckpt + "-dcpw", step=step, keep=1)
        ),
    }
    run_steps(model, opt, 2, args.every, None)  # warm-up: FSDP2's buffers, the optimizer's state
    results = {}
    for name, save in methods.items():
        for warm_up in (-2, -1):  # untimed: one-time set-up (DCP's checkpoint process, both staging slots, caches)
            save(warm_up)
            if pending:
                pending.pop().result()
        base, _ = run_steps(model, opt, args.steps, args.every, None)
        steps, calls = run_steps(model, opt, args.steps, args.every, save)
        if pending:
            pending.pop().result()
        results[name] = {"base": base, "steps": steps, "calls": calls}
    if rank == 0:
        print("RESULT " + json.dumps({"stall": results, "bytes": staged_bytes()}), flush=True)
    kill_phase(ckpt, model, opt, rank)


def staged_bytes() -> int:
    from launchers.elastic.ipc import staging

    return sum(i.status.state_bytes for i in staging.read_run(os.environ["MLAUNCH_RUN_ID"]))


def kill_phase(ckpt, model, opt, rank: int) -> None:  # type: ignore[no-untyped-def]
    """Stage every step until one of us is killed (mlaunch then flash-saves; the others are stopped)."""
    import torch.distributed as dist

    step = 1000
    while True:
        train_step(model, opt)
        dist.barrier()  # ranks in step, as training's collectives keep them: every rank has the same two steps staged
        ckpt.stage(step, state(model, opt))
        if step == 1002:
            print(f"ready {rank} {os.getpid()}", flush=True)
        step += 1


def load_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from launchers import elastic

    dist.init_process_group("gloo")
    model, opt = build(args.gib)
    times: dict[str, list[float]] = {"load_latest(into=)": [], "dcp.load": []}
    for _ in range(args.rounds):
        for name in times:
            target = state(model, opt)
            if dist.get_rank() == 0:
                drop_page_cache()
            dist.barrier()
            start = time.perf_counter()
            if name == "dcp.load":
                dcp.load(target, checkpoint_id=f"{args.dcp}/sync")
            else:
                assert elastic.Checkpointer(args.ckpt).load_latest(into=target) is not None
            dist.barrier()
            times[name].append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"load": times, "dropped": drop_page_cache()}), flush=True)


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------


class Job:
    """``mlaunch`` running this file's workers; its output lines as they come."""

    def __init__(self, work: Path, name: str, nodes: int, worker_args: list[str]) -> None:
        job = work / f"{name}.yaml"
        job.write_text(
            f"name: sharded-{name}\nentry: {HERE}\nargs: {json.dumps(worker_args)}\nnodes: {nodes}\n"
            f"procs_per_node: 2\nlog_dir: {work / 'logs'}\nenv: {{GLOO_SOCKET_IFNAME: lo}}\n"
            f"checkpoint: {{dir: {work / 'ckpt'}, grace_period: 300s, keep: 1}}\n"
        )
        env = platform_free_env()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip())

    def wait_for(self, word: str, count: int = 1, timeout: float = 1800) -> list[str]:
        end = time.monotonic() + timeout
        while True:
            found = [line for line in self.log if word in line]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"no {word!r}:\n" + "\n".join(self.log[-40:]))
            time.sleep(0.01)

    def result(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.wait_for("RESULT ")[0].split("RESULT ", 1)[1])


def kill_and_time(job: Job, ckpt: Path) -> float:
    ready = job.wait_for("ready ", count=4)
    pid = next(int(line.split()[-1]) for line in ready if line.split()[-2] == "1")
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while not committed(ckpt):
        if time.monotonic() - start > 600 or job.proc.poll() is not None:
            said = [line for line in job.log if "mlaunch" in line and "INFO" not in line]
            raise RuntimeError("no commit; mlaunch said:\n" + "\n".join(said[-40:]))
        time.sleep(0.001)
    took = time.monotonic() - start
    job.proc.wait(timeout=600)
    return took


def report(stall: dict, kill: float, cps: tuple[float, float], load: dict, nbytes: int, every: int) -> None:  # type: ignore[type-arg]
    print(f"\nFSDP2 state {nbytes / (1 << 30):.2f} GiB over 4 ranks (2 nodes x 2, gloo, CPU)", end="")
    print(f"; a checkpoint every {every} steps")
    print(f"{'method':>20} {'stall/ckpt':>11} {'in the call':>12}   (stall: median over checkpoints of the extra time")
    print(f"{'':>20} {'':>11} {'':>12}    of the steps from one checkpoint to the next)")
    stalls = {}
    for name, r in stall.items():
        step = statistics.median(r["base"])  # a step without checkpoints, same processes, just before
        cycles = [r["steps"][i : i + every] for i in range(0, len(r["steps"]) - every + 1, every)]
        stalls[name] = statistics.median(sum(cycle) - every * step for cycle in cycles)
        print(f"{name:>20} {stalls[name] * 1000:>9.0f}ms {statistics.median(r['calls']) * 1000:>10.0f}ms", end="")
        print(f"   (step {step * 1000:.0f}ms; {len(cycles)} checkpoints)")
    for other in ("async_save thread", "async_save process", "dcp.save"):
        ratio = stalls["stage()"] / stalls[other] if stalls[other] > 0 else float("nan")
        print(f"stage() stall / {other} stall: {ratio:.2f}x")
    # issue 33: would save() built on DCP's planner + MlaunchStorageWriter keep save()'s figure?
    ratio = stalls["dcp.save(ours)"] / stalls["save()"] if stalls["save()"] > 0 else float("nan")
    print(f"dcp.save(ours) stall / save() stall: {ratio:.2f}x")
    cp, cp_sync = cps
    print(f"\nkill -9 -> committed (flash save): {kill * 1000:.0f}ms", end="")
    print(f"; cp {cp * 1000:.0f}ms; cp+sync {cp_sync * 1000:.0f}ms")
    print(f"kill -9 commit / cp+sync: {kill / cp_sync:.2f}x (goal <= 1.2x)")
    print(f"\nresharding load, 4 -> 2 ranks (page cache {'dropped' if load['dropped'] else 'warm'} before each):")
    medians = {name: statistics.median(times) for name, times in load["load"].items()}
    for name, times in load["load"].items():
        print(f"{name:>20} median {medians[name] * 1000:.0f}ms  runs {[round(t * 1000) for t in times]}")
    print(f"load_latest(into=) / dcp.load: {medians['load_latest(into=)'] / medians['dcp.load']:.2f}x (goal <= 1.2x)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", choices=["stall", "load"], help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    parser.add_argument("--dcp", help=argparse.SUPPRESS)
    parser.add_argument("--gib", type=float, default=1.0, help="parameters + AdamW moments, GiB in all")
    parser.add_argument("--steps", type=int, default=12, help="steps per method (and per baseline)")
    parser.add_argument("--every", type=int, default=3, help="a checkpoint every N steps")
    parser.add_argument("--rounds", type=int, default=2, help="loads per loader")
    parser.add_argument("--step", choices=["compute", "fsdp2"], default="compute", help="what a training step is")
    parser.add_argument("--dir", default=None, help="work directory's parent (default: /tmp)")
    args, _ = parser.parse_known_args()
    if args.worker == "stall":
        stall_worker(args)
        return 0
    if args.worker == "load":
        load_worker(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="sharded-stall-", dir=args.dir) as tmp:
        work = Path(tmp)
        ckpt, dcp_dir = work / "ckpt", work / "dcp"
        common = ["--gib", str(args.gib), "--ckpt", str(ckpt), "--dcp", str(dcp_dir)]
        job = Job(
            work, "stall", 2, ["--worker", "stall", "--steps", str(args.steps), "--every", str(args.every), *common]
        )
        stall = job.result()
        kill = kill_and_time(job, ckpt)
        newest = sorted(p for p in ckpt.glob("step_*") if (p / "COMMITTED").exists())[-1]
        cps = cp_baseline(newest, work)
        load_job = Job(work, "load", 1, ["--worker", "load", "--rounds", str(args.rounds), *common])
        load = load_job.result()
        load_job.proc.wait(timeout=600)
        shutil.rmtree(work / "logs", ignore_errors=True)
        report(stall["stall"], kill, cps, load, stall["bytes"], args.every)
    return 0


if __name__ == "__main__":
    sys.exit(main())
