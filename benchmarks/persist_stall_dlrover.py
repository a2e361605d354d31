"""DLRover's flash checkpoint, measured the way ``persist_stall.py`` measures mlaunch (issue 14's comparison).

Run through ``python benchmarks/persist_stall.py --dlrover SITE``: SITE is a directory where
DLRover is installed apart from mlaunch's environment, e.g.

    pip install --target /tmp/dlr dlrover==0.6.1 pynvml deprecated grpcio kubernetes tornado protobuf

(it is appended to ``sys.path``, so the torch of this environment is the one used). Standalone,
as its docs allow: one process (world size 1, gloo), ``DdpCheckpointer(dir)``, whose engine starts
its own saver process on local rank 0 (``dlrover-run`` is not needed for this). Per size and round:

- ``memory``: ``save_checkpoint(step, sd, storage_type=StorageType.MEMORY)`` — the copy into
  DLRover's shared memory, the figure to set beside mlaunch's ``stage()``;
- ``disk``: ``save_checkpoint(step, sd, path, storage_type=StorageType.DISK)`` — the same copy,
  then its saver persists it in the background (the loop's stall, beside mlaunch's ``stage()``
  with ``checkpoint.persist_every``); each disk save must reach the disk (its tracker file names
  the step) before the next round, or the run fails.

Prints one JSON line ``dlrover-times {...}`` for the parent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def measure(site: str, sizes: list[int], rounds: int, where: Path) -> dict[str, dict[str, list[float]]]:
    sys.path.append(site)  # after this environment's own packages: torch stays ours
    import torch
    import torch.distributed as dist
    from dlrover.trainer.torch.flash_checkpoint.checkpointer import StorageType
    from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer

    dist.init_process_group("gloo")
    results: dict[str, dict[str, list[float]]] = {}
    for nbytes in sizes:
        directory = where / f"dlrover-{nbytes}"
        ckpt = DdpCheckpointer(str(directory))
        state: dict[str, Any] = {"step": 0, "weights": torch.ones(nbytes // 4, dtype=torch.float32)}
        for warm in (-2, -1):  # first use allocates its shared memory (a one-time cost, as for mlaunch)
            ckpt.save_checkpoint(warm, state, storage_type=StorageType.MEMORY)
        times: dict[str, list[float]] = {"memory": [], "disk": []}
        step = 0
        for _ in range(rounds):
            for kind, storage in (("memory", StorageType.MEMORY), ("disk", StorageType.DISK)):
                step += 1
                state["step"] = step
                state["weights"].add_(1.0)
                path = str(directory / str(step) / "rank_0.pt")
                started = time.perf_counter()
                ckpt.save_checkpoint(step, state, path, storage_type=storage)
                times[kind].append(time.perf_counter() - started)
                if kind == "disk":
                    wait_persisted(directory, step)  # the next round starts with the saver idle
        results[str(nbytes)] = times
    return results


def wait_persisted(directory: Path, step: int, timeout: float = 600) -> None:
    """Until DLRover's tracker file names ``step`` (its ``wait_latest_checkpoint`` polls every 3 s and
    raises when the file does not exist yet)."""
    tracker = directory / "dlrover_latest.txt"  # CheckpointConstant.TRACER_FILE_NAME
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if tracker.read_text().strip() == str(step) and (directory / str(step) / "rank_0.pt").exists():
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"DLRover's saver did not persist step {step} under {directory} in {timeout:g}s")


def main() -> None:
    site, sizes, rounds, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_PORT", sys.argv[5] if len(sys.argv) > 5 else "29533")
    results = measure(site, [int(s) for s in sizes.split(",")], rounds, where)
    print("dlrover-times " + json.dumps(results), flush=True)
    import psutil

    for child in psutil.Process().children(recursive=True):  # its saver sleeps forever, holding our stdout
        child.kill()
    os._exit(0)


if __name__ == "__main__":
    main()
