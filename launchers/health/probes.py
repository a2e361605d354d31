"""What one node measures about itself: compute, device memory in use, the checkpoint directory.

Each probe returns a plain JSON-able dict (it travels through the control plane to node 0)
and never raises: a probe that fails says so in ``error``, which makes the node faulty.

Compute is time-boxed rather than a fixed amount of work: a matmul loop runs for about
``COMPUTE_SECONDS`` and the figure is seconds per matmul. The same size runs on every node
of a kind (CPU or one device type), so the figures compare; a slow node still finishes in
about the same wall time instead of taking minutes (DLRover's 500 × 16384³ matmuls).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from launchers.health.priority import raised_priority

COMPUTE_SECONDS = 0.3  # wall time of the compute probe (after one warm-up matmul)
CPU_SIZE = 256  # matmul size on a CPU: ~34 MFLOP, a few ms per matmul
DEVICE_SIZE = 4096  # on a GPU: ~137 GFLOP, well under a millisecond on an H100
STORAGE_BYTES = 8 << 20  # written and fsynced in the checkpoint directory


def compute() -> dict[str, Any]:
    """Seconds per matmul (and GFLOP/s) with torch where installed (its device when there is one), else numpy."""
    try:
        try:
            import torch
        except ImportError:
            return _numpy_compute()
        return _torch_compute(torch)
    except Exception as exc:  # noqa: BLE001 - a broken framework or device makes the node faulty, not mlaunch crash
        return {"error": f"compute probe failed: {type(exc).__name__}: {exc}"}


def _torch_compute(torch: Any) -> dict[str, Any]:
    cuda = bool(torch.cuda.is_available())
    device = "cuda" if cuda else "cpu"
    size = DEVICE_SIZE if cuda else CPU_SIZE
    a = torch.rand(size, size, device=device)
    b = torch.rand(size, size, device=device)

    def step() -> None:
        torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize()

    threads = torch.get_num_threads()
    if not cuda:  # per-core speed: OpenMP threads waiting on a descheduled sibling swing 30× on a busy host
        torch.set_num_threads(1)
    try:
        seconds, ops = _time_box(step)
    finally:
        torch.set_num_threads(threads)
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    return _figures("torch", name, size, seconds, ops)


def _numpy_compute() -> dict[str, Any]:
    import numpy as np

    a = np.random.rand(CPU_SIZE, CPU_SIZE).astype(np.float32)
    b = np.random.rand(CPU_SIZE, CPU_SIZE).astype(np.float32)
    seconds, ops = _time_box(lambda: np.matmul(a, b))
    return _figures("numpy", "cpu", CPU_SIZE, seconds, ops)


def _time_box(step: Any) -> tuple[float, int]:
    """(seconds, matmuls) of a loop of about COMPUTE_SECONDS, at a raised priority where allowed."""
    with raised_priority():
        step()  # warm-up: allocation, kernels, thread pool
        ops = 0
        start = time.perf_counter()
        while True:
            step()
            ops += 1
            elapsed = time.perf_counter() - start
            if elapsed >= COMPUTE_SECONDS:
                return elapsed, ops


def _figures(framework: str, device: str, size: int, seconds: float, ops: int) -> dict[str, Any]:
    per_op = seconds / ops
    return {
        "framework": framework,
        "device": device,
        "size": size,
        "ops": ops,
        "seconds_per_op": per_op,
        "gflops": 2.0 * size**3 / per_op / 1e9,
    }


def memory() -> dict[str, Any]:
    """The fraction of each device's memory already in use (another job's leftovers), and the host's free RAM."""
    result: dict[str, Any] = {"devices": []}
    try:
        import psutil

        result["host_available_bytes"] = int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - host RAM is information only
        pass
    try:
        import torch
    except ImportError:
        return result
    try:
        if torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                free, total = torch.cuda.mem_get_info(index)
                result["devices"].append({"index": index, "used_fraction": 1.0 - free / total, "total_bytes": total})
    except Exception as exc:  # noqa: BLE001 - a device that cannot be asked is faulty
        result["error"] = f"device memory probe failed: {type(exc).__name__}: {exc}"
    return result


def storage(directory: Path) -> dict[str, Any]:
    """Is the checkpoint directory writable, how much is free, how fast does a synced write go."""
    result: dict[str, Any] = {"path": str(directory), "writable": False}
    probe = directory / f".mlaunch-health-{os.getpid()}-{time.monotonic_ns()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        result["free_bytes"] = int(shutil.disk_usage(directory).free)
        data = os.urandom(1 << 20)
        start = time.perf_counter()
        with open(probe, "wb") as handle:
            for _ in range(STORAGE_BYTES // len(data)):
                handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        elapsed = time.perf_counter() - start
        result["writable"] = True
        result["write_mb_s"] = STORAGE_BYTES / max(elapsed, 1e-9) / 1e6
    except OSError as exc:
        result["error"] = f"checkpoint directory {directory}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return result
