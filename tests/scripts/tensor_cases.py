"""One process, a one-rank gloo group: stage, save and load tensors that a raw-bytes reader must not misread.

Run by tests/test_tensor_safety.py in a subprocess (a memory-safety bug would kill the process
with SIGSEGV, not fail an assertion). Prints one JSON line per case:
``{"case": ..., "staged": "ok" | "refused: ...", "saved": ..., "loaded": "equal" | ...}``.
Needs MASTER_ADDR/MASTER_PORT, MLAUNCH_RUN_ID and MLAUNCH_SHM_DIR (staging outside mlaunch).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from launchers.elastic import Checkpointer, CheckpointError


class Wrapper(torch.Tensor):
    """A wrapper subclass (the pattern of Float8 and functional tensors): its data_ptr() is not its data."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Wrapper:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)  # type: ignore[attr-defined]

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from torch.utils._pytree import tree_map

        unwrap = lambda t: t.inner if isinstance(t, Wrapper) else t  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda t: Wrapper(t) if isinstance(t, torch.Tensor) else t, out)  # results stay wrapped


def cases(mesh: object) -> dict[str, torch.Tensor]:
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    return {
        "dtensor": distribute_tensor(base.clone(), mesh, [Shard(0)]),
        "wrapper": Wrapper(torch.arange(1 << 20, dtype=torch.float64)),
        "meta": torch.empty(1 << 20, device="meta"),
        "noncontiguous": base.t()[1:5, ::2],
        "zero_size": torch.empty(0, 7),
    }


def outcome(ckpt: Checkpointer, how: str, state: dict[str, object]) -> str:
    try:
        getattr(ckpt, how)(3, state)
    except CheckpointError as exc:
        return f"refused: {exc}"
    return "ok"


def main() -> None:
    root = sys.argv[1]
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    for name, tensor in cases(mesh).items():
        ckpt = Checkpointer(f"{root}/{name}")
        state = {"layer": {"w": tensor}, "step": 3}
        row = {"case": name, "staged": outcome(ckpt, "stage", state), "saved": outcome(ckpt, "save", state)}
        if row["saved"] == "ok":
            target = {"layer": {"w": torch.zeros_like(tensor)}, "step": 0}
            step = ckpt.load_latest(into=target)
            got, want = target["layer"]["w"], tensor
            if hasattr(want, "full_tensor"):
                got, want = got.full_tensor(), want.full_tensor()
            row["loaded"] = "equal" if step == 3 and target["step"] == 3 and torch.equal(got, want) else "differs"
            plain = Checkpointer(f"{root}/{name}").load_latest() if name != "dtensor" else None
            row["plain"] = "equal" if plain is not None and torch.equal(plain["layer"]["w"], tensor) else "-"
        print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
