"""Staging from GPU memory: the training stall per checkpoint, and a GPU job's kill -9 → flash save → restart.

Run it on a machine with a GPU (the figures in docs/benchmarks.md came from one H200); ``--device
cpu`` runs the same code paths on a small state, to check the harness anywhere.

1. **Stall** (one process, one GPU; ``--gib`` of state: the parameters of ``--layers`` square
   linear layers and AdamW's two moments). The same training steps (forward, backward, AdamW
   on the GPU) with a checkpoint every ``--every`` steps by
   - ``today``: the path before this change, kept as the baseline: ``t.cpu()`` per tensor
     (pageable memory, blocking), then a copy into the shared-memory slot;
   - ``stage``: ``Checkpointer.stage`` — device-to-host copies into one pinned buffer on a side
     stream, the compute stream fenced before its next kernel, the slot published by a writer
     thread once the copy's event completed;
   - ``stage-overlap``: the same with ``stage_overlap=True`` (the fence at the next optimizer
     step: the copy overlaps the next forward and backward);
   - ``dcp.async_save``: DCP's asynchronous save to a local directory (its default stager;
     the previous save is waited for before the next, as a training loop must);
   each against the same steps without checkpoints, measured in the same process just before.
   Figures: the time inside the call (median) and the extra wall time per checkpoint (the
   loop's time less the loop without checkpoints, over the checkpoints). Then the new path is
   checked for what it must never get wrong on a real device: what a slot holds equals the
   state at the staged step, bit for bit, in both fence modes, with the optimizer changing the
   parameters right after ``stage`` returned; and the pinned buffer is allocated once.
2. **kill -9 on a GPU job** (``--e2e-mib`` of state per rank, 2 ranks sharing the GPU, gloo
   between them, warm standbys): mlaunch runs ``--worker``; one rank is SIGKILLed; measured:
   kill → the flash save's commit, kill → first step of the restarted group, and whether the
   resumed state's checksum equals the one printed at the committed step. While the first
   group trains, the warm parent and the standbys are checked for an open GPU device file or a
   mapped ``libcuda``: the warm parent must never touch the GPU (it forks); each standby opens
   it after its fork when ``preload_device`` is on (``--no-preload-device``: the old path, none
   does), so the waiting processes with a device open are all of them but the warm parent.

0. **Rate** (``--phase rate``): ``--gib`` in 16 tensors off an idle device — one copy into pinned
   memory, one into pageable memory, and ``stage()`` of the same tensors (until its copies left
   the device, and until its slot was published): is a stage limited by the machine or by mlaunch?

    python benchmarks/device_stage.py [--device cuda] [--gib 4.5] [--out results.json]
    python benchmarks/device_stage.py --device cpu --gib 0.05 --width 1024 --batch 512 --e2e-mib 8  # anywhere, ~20 s
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))


# ----------------------------------------------------------------------------------------
# 1. Stall
# ----------------------------------------------------------------------------------------


def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device(args.device)
    # parameters + AdamW's two moments: 12 bytes per fp32 parameter
    width = args.width
    params_per_layer = width * width
    layers = max(1, round(args.gib * (1 << 30) / (12 * params_per_layer)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randn(args.batch, width, device=device)
    return model, optimizer, x


def train_step(model: Any, optimizer: Any, x: Any) -> None:
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def snapshot(model: Any, optimizer: Any, step: int) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step}


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def state_bytes(state: Any) -> int:
    import torch

    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    return 0


def timed_loop(args: argparse.Namespace, model: Any, optimizer: Any, x: Any, checkpoint: Any) -> dict[str, Any]:
    """``--steps`` steps, ``checkpoint(step)`` every ``--every``: the loop's time and the times inside the call."""
    inside: list[float] = []
    synchronize(args.device)
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        train_step(model, optimizer, x)
        if checkpoint is not None and step % args.every == 0:
            t0 = time.perf_counter()
            checkpoint(step)
            inside.append(time.perf_counter() - t0)
    synchronize(args.device)
    return {"loop": time.perf_counter() - started, "inside": inside}


def stall_phase(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    from launchers.elastic import Checkpointer
    from launchers.elastic.format import shardfile
    from launchers.elastic.ipc import device_stage, rank_segment

    os.environ["MLAUNCH_RUN_ID"] = f"devstage{os.getpid()}"  # a segment to stage into, as under mlaunch
    os.environ["MLAUNCH_SHM_DIR"] = str(args.shm)
    model, optimizer, x = build(args)
    for _ in range(3):  # warm-up: kernels, AdamW's moments exist after the first step
        train_step(model, optimizer, x)
    nbytes = state_bytes(snapshot(model, optimizer, 0))
    result: dict[str, Any] = {"state_gib": nbytes / (1 << 30), "steps": args.steps, "every": args.every}
    print(
        f"state {nbytes / (1 << 30):.2f} GiB per rank; {args.steps} steps, a checkpoint every {args.every}", flush=True
    )

    segment = rank_segment.process_segment(0, 1)
    assert segment is not None
    segment.set_target(str(work / "ckpt"), 2)

    def today(step: int) -> None:
        segment.stage(step, shardfile.encode(snapshot(model, optimizer, step)))

    plain = Checkpointer(work / "ckpt")
    overlapped = Checkpointer(work / "ckpt", stage_overlap=True)
    saves: list[Any] = []
    dcp_waits: list[float] = []
    to_slot: list[float] = []
    off_device: list[float] = []

    def dcp_async(step: int) -> None:
        import torch.distributed.checkpoint as dcp

        if saves:
            t0 = time.perf_counter()
            saves[-1][0].result()  # the previous save must end before the next: its memory is reused
            dcp_waits.append(time.perf_counter() - t0)
            shutil.rmtree(saves[-1][1], ignore_errors=True)
        where = work / f"dcp_{step}"
        saves.append((dcp.async_save(snapshot(model, optimizer, step), checkpoint_id=str(where)), where))

    def staged(ckpt: Any) -> Any:
        def stage(step: int) -> None:
            stager = device_stage.process_stager(ckpt.stage_overlap)
            before = stager.to_slot
            ckpt.stage(step, snapshot(model, optimizer, step))
            if stager.to_slot != before:
                to_slot.append(stager.to_slot)
                off_device.append(stager.off_device)

        return stage

    modes: list[tuple[str, Any]] = [
        ("today", today),
        ("stage", staged(plain)),
        ("stage-overlap", staged(overlapped)),
        ("dcp.async_save", dcp_async),
    ]
    # once, untimed: the shared-memory segment (two slots, fallocated) and the pinned buffer exist before any
    # mode is timed — otherwise the first mode to stage pays them in its first checkpoint
    plain.stage(0, snapshot(model, optimizer, 0))
    device_stage.process_stager().wait()
    rows = {}
    for name, checkpoint in modes:
        dcp_waits.clear()
        to_slot.clear()
        off_device.clear()
        stager = device_stage.process_stager()
        waited_before = stager.waited
        try:
            none = timed_loop(args, model, optimizer, x, None)
            got = timed_loop(args, model, optimizer, x, checkpoint)
            if name.startswith("stage"):
                device_stage.process_stager().wait()
            if name == "dcp.async_save" and saves:
                saves[-1][0].result()
            count = len(got["inside"])
            extra = (got["loop"] - none["loop"]) / max(count, 1)
            rows[name] = {
                "step_s": none["loop"] / args.steps,
                "inside_s": statistics.median(got["inside"]) if got["inside"] else 0.0,
                "extra_per_checkpoint_s": extra,
                "checkpoints": count,
            }
            if name.startswith("stage"):
                rows[name]["waited_for_previous_s"] = (stager.waited - waited_before) / max(count, 1)
                rows[name]["stage_to_slot_s"] = statistics.median(to_slot) if to_slot else None
                rows[name]["off_device_s"] = statistics.median(off_device) if off_device else None
            if name == "dcp.async_save":
                rows[name]["waited_for_previous_s"] = sum(dcp_waits) / max(count, 1)
            extras = "".join(
                f"   {key} {value * 1000:.1f} ms"
                for key, value in rows[name].items()
                if key in ("waited_for_previous_s", "stage_to_slot_s", "off_device_s") and value is not None
            )
            print(
                f"{name:15} step {rows[name]['step_s'] * 1000:8.1f} ms   inside the call "
                f"{rows[name]['inside_s'] * 1000:8.1f} ms   extra per checkpoint {extra * 1000:8.1f} ms{extras}",
                flush=True,
            )
        except Exception as exc:  # noqa: BLE001 - a mode that fails is reported, the others still run
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name:15} FAILED {type(exc).__name__}: {exc}", flush=True)
    result["modes"] = rows
    stager = device_stage.process_stager()
    result["pinned_allocations"] = stager.allocations
    result["pinned_bytes"] = stager.host.nbytes if stager.host else 0
    result["slot_capacity"] = segment.capacity
    result["checks"] = {
        "slot_equals_staged_state": check_slots(args, model, optimizer, x, plain, overlapped, segment),
    }
    result["pinned_allocations_after_checks"] = stager.allocations
    print(
        f"pinned buffer: {result['pinned_bytes'] / (1 << 30):.2f} GiB allocated {stager.allocations} time(s); "
        f"slot capacity {segment.capacity / (1 << 30):.2f} GiB",
        flush=True,
    )
    del torch
    return result


def check_slots(
    args: argparse.Namespace, model: Any, optimizer: Any, x: Any, plain: Any, overlapped: Any, seg: Any
) -> dict[str, bool]:
    """Stage, let the optimizer change the parameters at once, then compare the slot with the state at the stage."""
    import torch

    from launchers.elastic.format import shardfile
    from launchers.elastic.ipc import device_stage, staging

    verdicts = {}
    for name, ckpt in (("stage", plain), ("stage-overlap", overlapped)):
        for trial in range(3):
            step = 1000 + trial + (100 if name == "stage-overlap" else 0)
            train_step(model, optimizer, x)
            expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            ckpt.stage(step, snapshot(model, optimizer, step))
            train_step(model, optimizer, x)  # changes every parameter in place while the copy may still run
            train_step(model, optimizer, x)
            device_stage.process_stager().wait()
            with staging.SegmentReader(seg.path) as reader:
                slot = max((s for s in reader.slots() if s.complete), key=lambda s: (s.step, s.seq))
                decoded, _ = shardfile.decode(bytearray(reader.data(slot)))
            same = slot.step == step and all(torch.equal(decoded["model"][k], v) for k, v in expected.items())
            verdicts[f"{name} #{trial}"] = bool(same)
            print(
                f"check {name} #{trial}: the slot holds step {slot.step}, equal to the staged state: {same}", flush=True
            )
    return verdicts


def rate_phase(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Device-to-host rates on an idle device: a plain pinned copy, a pageable one, and a stage() of the same bytes.

    Tells whether a stage is limited by the machine's path to the device or by mlaunch: the
    stage's time until its copies left the device, against one pinned copy of the same size.
    """
    import torch

    from launchers.elastic import Checkpointer
    from launchers.elastic.ipc import device_stage

    os.environ["MLAUNCH_RUN_ID"] = f"devrate{os.getpid()}"
    os.environ["MLAUNCH_SHM_DIR"] = str(args.shm)
    nbytes = int(args.gib * (1 << 30)) // 4 * 4
    tensors = [torch.randn(nbytes // 4 // 16, device=args.device) for _ in range(16)]  # 16 tensors, as a state
    whole = torch.cat(tensors)
    pinned = torch.empty(whole.numel(), dtype=whole.dtype, pin_memory=args.device.startswith("cuda"))
    pageable = torch.empty(whole.numel(), dtype=whole.dtype)

    def copy_seconds(target: Any) -> float:
        times = []
        for _ in range(3):
            synchronize(args.device)
            t0 = time.perf_counter()
            target.copy_(whole, non_blocking=True)
            synchronize(args.device)
            times.append(time.perf_counter() - t0)
        return min(times)

    pinned_s, pageable_s = copy_seconds(pinned), copy_seconds(pageable)
    ckpt = Checkpointer(work / "ckpt")
    stager = device_stage.process_stager()
    off, to_slot = [], []
    for step in range(1, 5):
        synchronize(args.device)
        ckpt.stage(step, {"tensors": tensors})
        stager.wait()
        off.append(stager.off_device)
        to_slot.append(stager.to_slot)
    gb = nbytes / 1e9
    result = {
        "gib": nbytes / (1 << 30),
        "pinned_copy_s": pinned_s,
        "pinned_gb_per_s": gb / pinned_s,
        "pageable_copy_s": pageable_s,
        "pageable_gb_per_s": gb / pageable_s,
        "stage_off_device_s": min(off[1:]),
        "stage_to_slot_s": min(to_slot[1:]),
    }
    print(
        f"{result['gib']:.2f} GiB device → host: one pinned copy {pinned_s * 1000:.0f} ms ({gb / pinned_s:.1f} GB/s), "
        f"pageable {pageable_s * 1000:.0f} ms ({gb / pageable_s:.1f} GB/s); stage(): off the device "
        f"{result['stage_off_device_s'] * 1000:.0f} ms, in the slot {result['stage_to_slot_s'] * 1000:.0f} ms",
        flush=True,
    )
    return result


# ----------------------------------------------------------------------------------------
# 2. kill -9 on a GPU job under mlaunch
# ----------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """What mlaunch runs in the end-to-end phase; ``--in-process``: under ``@elastic.recoverable``."""
    if os.environ.get("BENCH_IN_PROCESS") == "1":
        from launchers import elastic

        elastic.recoverable(train_worker)(args)
    else:
        train_worker(args)


def train_worker(args: argparse.Namespace) -> None:
    """2 ranks, the same state, staged every step."""
    import torch.distributed as dist

    from launchers import elastic

    began = time.monotonic()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    marks = {"process_group": time.monotonic() - began}
    guard = elastic.install()
    ckpt = elastic.Checkpointer(os.environ["MLAUNCH_CHECKPOINT_DIR"])
    args.gib = args.e2e_mib / 1024
    model, optimizer, x = build(args)
    synchronize(args.device)
    marks["model_on_device"] = time.monotonic() - began
    print(f"rank {rank} pid {os.getpid()}", flush=True)
    start = 0
    loaded = ckpt.load_latest()
    marks["load_latest"] = time.monotonic() - began
    if loaded is not None:
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optim"])
        start = int(loaded["step"])
    synchronize(args.device)
    marks["state_on_device"] = time.monotonic() - began
    shown = ", ".join(f"{name} {at:.2f}s" for name, at in marks.items())
    print(f"timing rank {rank}: {shown} after the script began", flush=True)
    print(f"rank {rank} start {start} checksum {checksum(model, optimizer)}", flush=True)
    for step in range(start + 1, args.steps + 1):
        train_step(model, optimizer, x)
        ckpt.stage(step, snapshot(model, optimizer, step))
        print(f"rank {rank} step {step} checksum {checksum(model, optimizer)}", flush=True)
        time.sleep(args.step_sleep)
        if guard.should_stop(step):
            guard.exit()
    elastic.finished()


def checksum(model: Any, optimizer: Any) -> str:
    import torch

    total = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
    for tensor in model.state_dict().values():
        total += tensor.double().sum()
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.double().sum().to(total.device)
    return f"{total.item():.12e}"


LINE = re.compile(r"^\[(?:node \d+ )?rank \d+\] rank (\d+) (pid|start|step) (\d+)(?: checksum (\S+))?$")


def device_holders(pid: int) -> list[str]:
    """What in ``pid`` touches the GPU: open device files, a mapped driver library."""
    found = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(("/dev/nvidia", "/dev/davinci", "/dev/dri", "/dev/accel")):
                    found.append(target)
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
        found += sorted({line.split()[-1] for line in maps if "libcuda.so" in line or "libascendcl" in line})
    return found


def standby_processes(exclude: set[int]) -> dict[int, str]:
    """Processes of the warm parent and its standbys (their command line names the module)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            if "launchers.standby" in cmd:
                found[int(entry)] = cmd.strip()
    return found


def warm_parent_of(waiting: dict[int, str]) -> int | None:
    """The warm parent among the waiting processes: the oldest named ``warm_parent`` (its forked standbys carry
    the same command line, and start after it)."""
    started = {}
    for pid, cmd in waiting.items():
        if "warm_parent" in cmd:
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat") as fh:
                started[pid] = int(fh.read().rsplit(")", 1)[1].split()[19])  # starttime, in clock ticks
    return min(started, key=lambda pid: started[pid]) if started else None


def result_preload(args: argparse.Namespace) -> str:
    return "false" if args.no_preload_device else "true"


def e2e_phase(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    job = work / "job.yaml"
    ckpt = work / "ckpt"
    worker_args = ["--worker", "--device", args.device, "--e2e-mib", str(args.e2e_mib), "--width", str(args.width)]
    worker_args += ["--batch", str(args.batch), "--steps", str(args.e2e_steps), "--step-sleep", str(args.step_sleep)]
    quoted = ", ".join(f'"{a}"' for a in worker_args)
    job.write_text(
        f"name: device-stage\nengine: pytorch\nentry: {HERE.name}\npython: {sys.executable}\ncode_dir: {HERE.parent}\n"
        f"args: [{quoted}]\nnodes: 1\nprocs_per_node: 2\nlog_dir: {work / 'logs'}\n"
        "env: {GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: '1'}\n"
        f"checkpoint: {{dir: {ckpt}, grace_period: 30s}}\n"
        "restart: {max_restarts: 1, backoff: 0s}\n"
        "preload: [torch, torch.distributed, launchers.elastic]\n"
        f"preload_device: {'false' if args.no_preload_device else 'true'}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLAUNCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    if args.in_process:
        env["BENCH_IN_PROCESS"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout or []:
            lines.append((time.monotonic(), line.rstrip()))

    reader = threading.Thread(target=read)
    reader.start()
    result: dict[str, Any] = {"state_mib_per_rank": args.e2e_mib, "in_process": bool(args.in_process)}
    result["preload_device"] = not args.no_preload_device
    try:
        result.update(drive(args, lines))
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
        result["exit_code"] = proc.returncode
        (work / "mlaunch.log").write_text("\n".join(text for _, text in lines) + "\n")
        if args.out:
            shutil.copy(work / "mlaunch.log", Path(args.out).with_suffix(".mlaunch.log"))
    return result


def wait_for(
    lines: list[tuple[float, str]], predicate: Any, what: str, timeout: float = 240.0, since: int = 0
) -> tuple[float, str]:
    """The first line from ``since`` on that ``predicate`` accepts, with when it was read."""
    deadline = time.monotonic() + timeout
    seen = since
    while time.monotonic() < deadline:
        while seen < len(lines):
            at, text = lines[seen]
            seen += 1
            if predicate(text):
                return at, text
        time.sleep(0.01)
    tail = "\n".join(text for _, text in lines[-30:])
    raise TimeoutError(f"no {what} within {timeout:.0f}s; last lines:\n{tail}")


def rank_pid_after(lines: list[tuple[float, str]], rank: int) -> int | None:
    """The pid ``rank`` printed in ``lines`` (after a fault: its new process, or the same one kept in place)."""
    for _, text in lines:
        m = LINE.match(text)
        if m and m.group(2) == "pid" and int(m.group(1)) == rank:
            return int(m.group(3))
    return None


def drive(args: argparse.Namespace, lines: list[tuple[float, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pids: dict[int, int] = {}
    checksums: dict[int, str] = {}
    kill_at = 0

    def parsed(text: str) -> re.Match[str] | None:
        return LINE.match(text)

    def step_seen(text: str) -> bool:
        m = parsed(text)
        if m and m.group(2) == "pid":
            pids[int(m.group(1))] = int(m.group(3))
        if m and m.group(2) == "step" and m.group(1) == "0":
            checksums[int(m.group(3))] = m.group(4)
        return bool(m and m.group(2) == "step" and m.group(1) == "0" and int(m.group(3)) >= kill_at)

    wait_for(lines, lambda t: "warm standby workers ready" in t, "standbys ready")
    for _, text in list(lines):
        step_seen(text)
    kill_at = max(checksums, default=0) + 3  # a few steps after the standbys are ready
    if kill_at >= args.e2e_steps - 3:
        raise RuntimeError(f"the standbys were ready only at step {kill_at - 3} of {args.e2e_steps}: raise --e2e-steps")
    wait_for(lines, step_seen, f"step {kill_at}")
    waiting = standby_processes(set(pids.values()))
    holders = {pid: device_holders(pid) for pid in waiting}
    parent = warm_parent_of(waiting)
    out["warm_parent"] = parent is not None
    out["standbys_checked"] = len(holders)
    # an open device file is an initialised CUDA (the warm parent must never have one: it forks; each standby has
    # one with preload_device, on its rank's GPU); libcuda.so mapped by `import torch` is not
    opened = {p: [f for f in found if f.startswith("/dev/nvidia") and f[11:].isdigit()] for p, found in holders.items()}
    out["warm_parent_gpu_devices_open"] = opened.get(parent, []) if parent is not None else []
    out["standbys_with_a_gpu_device_open"] = {str(p): files for p, files in opened.items() if files and p != parent}
    out["standbys_with_libcuda_mapped"] = sum(1 for found in holders.values() if any("libcuda" in f for f in found))
    print(
        f"warm parent: {out['warm_parent']}, GPU devices open in it: {out['warm_parent_gpu_devices_open']} (must be "
        f"none); standbys checked: {len(holders) - (parent is not None)}; with a GPU device open (preload_device: "
        f"{result_preload(args)}): {out['standbys_with_a_gpu_device_open']}; with libcuda.so mapped: "
        f"{out['standbys_with_libcuda_mapped']}",
        flush=True,
    )

    victim = pids[1]
    survivor = pids.get(0)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    before = len(lines)
    committed_at, committed_line = wait_for(
        lines, lambda t: "flash save" in t and "committed step" in t, "flash save", since=before
    )
    step_match = re.search(r"committed step (\d+)", committed_line)
    committed = int(step_match.group(1)) if step_match else -1
    resumed_at, resumed_line = wait_for(
        lines, lambda t: bool((m := parsed(t)) and m.group(2) == "start" and m.group(1) == "0"), "restart", since=before
    )
    after_start = lines.index((resumed_at, resumed_line))
    first_at, _ = wait_for(
        lines,
        lambda t: bool((m := parsed(t)) and m.group(2) == "step" and m.group(1) == "0"),
        "first step",
        since=after_start,
    )
    resumed = parsed(resumed_line)
    assert resumed is not None
    for _, text in lines[:before]:
        step_seen(text)
    out.update(
        {
            "killed_at_step": max(checksums),
            "committed_step": committed,
            "resumed_step": int(resumed.group(3)),
            "kill_to_commit_s": committed_at - killed,
            "kill_to_first_step_s": first_at - killed,
            "resumed_state_equals_committed": checksums.get(int(resumed.group(3))) == resumed.group(4),
            "survivor_kept_its_process": survivor is not None and rank_pid_after(lines[before:], 0) == survivor,
            "committed_line": committed_line,
        }
    )
    print(
        f"kill -9 at step {out['killed_at_step']}: flash save committed step {committed} in "
        f"{out['kill_to_commit_s']:.2f}s; first step of the restarted group {out['kill_to_first_step_s']:.2f}s after "
        f"the kill, from step {out['resumed_step']}; state equal to the one at that step: "
        f"{out['resumed_state_equals_committed']}",
        flush=True,
    )
    wait_for(lines, lambda t: "job finished" in t, "the end", timeout=300)
    return out


# ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gib", type=float, default=4.5, help="state per rank in the stall phase (params + AdamW)")
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--e2e-mib", type=float, default=1024.0, help="state per rank in the kill -9 phase")
    parser.add_argument("--e2e-steps", type=int, default=60)
    parser.add_argument(
        "--in-process", action="store_true", help="e2e: the worker under @elastic.recoverable (survivors stay)"
    )
    parser.add_argument(
        "--no-preload-device", action="store_true", help="e2e: standbys do not initialise CUDA ahead (the old path)"
    )
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--phase", choices=["all", "stall", "e2e", "rate"], default="all")
    parser.add_argument("--shm", default="/dev/shm")
    parser.add_argument("--dir", default=None, help="where checkpoints go (default: a temporary directory)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    work = Path(tempfile.mkdtemp(prefix="device-stage-", dir=args.dir))
    results: dict[str, Any] = {"device": args.device}
    try:
        import torch

        if args.device.startswith("cuda"):
            results["gpu"] = torch.cuda.get_device_name()
        results["torch"] = torch.__version__
        del torch
        if args.phase in ("all", "rate"):
            (work / "rate").mkdir()
            results["rate"] = rate_phase(args, work / "rate")
        if args.phase in ("all", "stall"):
            (work / "stall").mkdir()
            results["stall"] = stall_phase(args, work / "stall")
        if args.phase in ("all", "e2e"):
            (work / "e2e").mkdir()
            try:
                results["e2e"] = e2e_phase(args, work / "e2e")
            except Exception as exc:  # noqa: BLE001 - the stall figures are still written
                results["e2e"] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"e2e FAILED {type(exc).__name__}: {exc}", flush=True)
    finally:
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
        shutil.rmtree(work, ignore_errors=True)
        drop_own_segments(args.shm)
    print(json.dumps(results, indent=2), flush=True)


def drop_own_segments(shm: str) -> None:
    """Remove the shared memory the rate and stall phases staged into: no mlaunch ran them, so none sweeps it."""
    from launchers.elastic.ipc import progress, staging

    os.environ["MLAUNCH_SHM_DIR"] = str(shm)
    for prefix in ("devrate", "devstage"):
        staging.unlink_run(f"{prefix}{os.getpid()}")
        progress.unlink_run(f"{prefix}{os.getpid()}")


if __name__ == "__main__":
    main()
