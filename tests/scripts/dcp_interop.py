"""A DCP user's script under mlaunch: dcp.save / async_save / load through mlaunch's storage plug-ins.

Run by tests/test_dcp_storage.py as the entry of an mlaunch job (FSDP2 on gloo, any world size):

- ``save-dcp DIR REF``: steps 2, 3, 4 saved with ``dcp.save``, ``dcp.async_save`` (thread) and
  ``dcp.async_save`` (process) into ``MlaunchStorageWriter(DIR)``;
- ``save-mlaunch DIR REF``: step 5 saved with mlaunch's own ``Checkpointer.save``;
- ``stage-dcp DIR REF``: every step staged with ``dcp.save(..., MlaunchStorageWriter(stage=True))``;
  rank 3 kills itself (-9) at step 4 of attempt 0; the restarted attempt loads what mlaunch's
  flash save committed with ``dcp.load`` and checks it;
- ``load DIR REF HOW``: load the newest step (and step 2 when it exists) with ``dcp.load``
  (HOW=dcp) or ``Checkpointer.load_latest(into=...)`` (HOW=mlaunch) and compare with REF.

REF/step_N.pt holds the whole model and optimizer state at step N (gathered, written by rank 0:
the test's own reference files, trusted).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from launchers.elastic import Checkpointer
from launchers.elastic.pytorch import MlaunchStorageReader, MlaunchStorageWriter


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 5))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def train(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    gen = torch.Generator().manual_seed(100 * step + dist.get_rank())
    model(torch.randn(4, 8, generator=gen)).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()


def state(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> dict[str, object]:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "step": step, "extra": {"note": f"step {step}", "pair": (1, 2.5)}}


def whole(value: object) -> object:
    """Every tensor gathered (collective), for comparing states saved and loaded at different world sizes."""
    if isinstance(value, dict):
        return {k: whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole(v) for v in value]
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def write_ref(ref: Path, step: int, current: dict[str, object]) -> None:
    gathered = whole({"model": current["model"], "optim": current["optim"]})
    if dist.get_rank() == 0:
        ref.mkdir(parents=True, exist_ok=True)
        torch.save(gathered, ref / f"step_{step}.pt")


def check(ref: Path, step: int, loaded: dict[str, object], model: nn.Module, opt: torch.optim.Optimizer) -> None:
    set_state_dict(model, opt, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    got = whole(dict(zip(("model", "optim"), get_state_dict(model, opt), strict=True)))
    want = torch.load(ref / f"step_{step}.pt", weights_only=False)
    same = (
        _equal(got, want) and loaded["step"] == step and loaded["extra"] == {"note": f"step {step}", "pair": (1, 2.5)}
    )
    if dist.get_rank() == 0:
        print(f"loaded step {step} at world size {dist.get_world_size()}: {'equal' if same else 'DIFFERS'}", flush=True)
    if not same:
        raise SystemExit(1)


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def save_dcp(root: Path, ref: Path, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    for step in (1, 2):
        train(model, opt, step)
    dcp.save(state(model, opt, 2), storage_writer=MlaunchStorageWriter(root, step=2))
    write_ref(ref, 2, state(model, opt, 2))
    train(model, opt, 3)
    dcp.async_save(state(model, opt, 3), storage_writer=MlaunchStorageWriter(root), checkpoint_id="3").result()
    write_ref(ref, 3, state(model, opt, 3))
    train(model, opt, 4)
    process = AsyncCheckpointerType.PROCESS
    future = dcp.async_save(
        state(model, opt, 4), storage_writer=MlaunchStorageWriter(root, step=4), async_checkpointer_type=process
    )
    future.result()
    write_ref(ref, 4, state(model, opt, 4))
    from torch.distributed.checkpoint import _async_process_executor as executor

    if executor._CHECKPOINT_PROCESS is not None:  # end DCP's checkpoint process now: os._exit skips its finalizer
        executor._CHECKPOINT_PROCESS.__del__()
        executor._CHECKPOINT_PROCESS = None


def stage_dcp(root: Path, ref: Path, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    attempt = int(os.environ.get("MLAUNCH_RESTART_COUNT", "0"))
    if attempt > 0:
        loaded = state(model, opt, -1)
        reader = MlaunchStorageReader(root)
        dcp.load(loaded, storage_reader=reader)
        check(ref, reader.chosen().step, loaded, model, opt)
        return
    for step in range(1, 7):
        train(model, opt, step)
        current = state(model, opt, step)
        write_ref(ref, step, current)
        dcp.save(current, storage_writer=MlaunchStorageWriter(root, step=step, stage=True))
        if step == 4 and dist.get_rank() == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()


def per_rank(root: Path, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """FSDP2 state beside each rank's own values, saved by ``Checkpointer.save`` and by ``dcp.save``, loaded back.

    Prints what each rank got back of its own values: ``Checkpointer`` keeps every rank's;
    DCP's planner keeps one value per key (its global plan deduplicates what is not a DTensor).
    """
    for step in (1, 2):
        train(model, opt, step)
    rank = dist.get_rank()

    def with_own(rng: int, cursor: int) -> dict[str, object]:
        return {**state(model, opt, 2), "rng": torch.tensor([rng]), "cursor": cursor}

    Checkpointer(root / "save").save(2, with_own(100 + rank, 7 * rank))
    dcp.save(with_own(100 + rank, 7 * rank), storage_writer=MlaunchStorageWriter(root / "dcp", step=2))
    for how in ("save", "dcp"):
        loaded = with_own(-1, -1)
        if how == "save":
            assert Checkpointer(root / "save").load_latest(into=loaded) == 2
        else:
            dcp.load(loaded, storage_reader=MlaunchStorageReader(root / "dcp"))
        got = (int(loaded["rng"].item()), loaded["cursor"])  # type: ignore[attr-defined]
        print(f"per-rank {how}: rank {rank} saved {(100 + rank, 7 * rank)} loaded {got}", flush=True)


def main() -> None:
    mode, root, ref = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    model, opt = build()
    if mode == "save-dcp":
        save_dcp(root, ref, model, opt)
    elif mode == "save-mlaunch":
        for step in range(1, 6):
            train(model, opt, step)
        Checkpointer(root).save(5, state(model, opt, 5))
        write_ref(ref, 5, state(model, opt, 5))
    elif mode == "stage-dcp":
        stage_dcp(root, ref, model, opt)
    elif mode == "per-rank":
        per_rank(root, model, opt)
    elif mode == "load":
        loads = [None, 2] if sys.argv[4] == "dcp" and (root / "step_00000002").exists() else [None]
        for step in loads:
            loaded = state(model, opt, -1)
            if sys.argv[4] == "dcp":
                reader = MlaunchStorageReader(root, step=step)
                dcp.load(loaded, storage_reader=reader)
                check(ref, reader.chosen().step, loaded, model, opt)
            else:
                ckpt = Checkpointer(root)
                got = ckpt.load_latest(into=loaded)
                assert got is not None
                check(ref, got, loaded, model, opt)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
