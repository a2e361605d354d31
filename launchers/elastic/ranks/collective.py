"""The few collectives graceful exit needs, over whichever framework the script initialised.

Agreement to stop, "did every rank write its shard", "did rank 0 commit" are each one tiny
collective. They run over ``torch.distributed`` when the script initialised it, over
MindSpore's communication when that is initialised, and are local no-ops otherwise (a
single process, or a script that never set up a process group).

Nothing here imports a framework: a framework counts only if the script already imported
it (``sys.modules``). The torch calls go through ``torch.distributed.distributed_c10d``
directly, so a test that wraps ``torch.distributed.all_reduce`` to count a script's own
collectives does not count ours.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from launchers import log


class Collective(Protocol):
    """Rank/world of this process and integer reductions across every rank."""

    name: str

    def rank(self) -> int: ...
    def world_size(self) -> int: ...
    def all_reduce(self, values: list[int], op: str) -> list[int]: ...  # op: "max" | "min" | "sum"
    def all_gather(self, values: list[int]) -> list[list[int]]: ...


class Local:
    """No process group: this process is the whole world as far as agreement goes."""

    name = "local"

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self._rank = rank
        self._world = world

    def rank(self) -> int:
        return self._rank

    def world_size(self) -> int:
        return self._world

    def all_reduce(self, values: list[int], op: str) -> list[int]:
        return list(values)

    def all_gather(self, values: list[int]) -> list[list[int]]:
        return [list(values)]


class Torch:
    """``torch.distributed`` once ``init_process_group`` ran (gloo on CPU, nccl/hccl on devices)."""

    name = "torch"

    def __init__(self) -> None:
        self._c10d = sys.modules["torch.distributed"].distributed_c10d
        self._torch = sys.modules["torch"]

    def _device(self) -> Any:
        backend = str(self._c10d.get_backend()).lower()
        if "nccl" in backend:
            return self._torch.device("cuda", self._torch.cuda.current_device())
        if "hccl" in backend:
            return self._torch.device("npu", self._torch.npu.current_device())  # torch_npu
        return self._torch.device("cpu")

    def rank(self) -> int:
        return int(self._c10d.get_rank())

    def world_size(self) -> int:
        return int(self._c10d.get_world_size())

    def all_reduce(self, values: list[int], op: str) -> list[int]:
        torch = self._torch
        tensor = torch.tensor(values, dtype=torch.int64, device=self._device())
        reduce_op = {"max": self._c10d.ReduceOp.MAX, "min": self._c10d.ReduceOp.MIN, "sum": self._c10d.ReduceOp.SUM}
        self._c10d.all_reduce(tensor, op=reduce_op[op])
        return [int(v) for v in tensor.cpu().tolist()]

    def all_gather(self, values: list[int]) -> list[list[int]]:
        torch = self._torch
        tensor = torch.tensor(values, dtype=torch.int64, device=self._device())
        out = [torch.zeros_like(tensor) for _ in range(self.world_size())]
        self._c10d.all_gather(out, tensor)
        return [[int(v) for v in t.cpu().tolist()] for t in out]


class MindSpore:
    """MindSpore's communication (HCCL/MCCL) after ``mindspore.communication.init()``.

    MindSpore's CPU collectives take float32/float16 only and its CPU AllReduce only sums, so
    every reduction is an AllGather of float32 values (each integer split into 20-bit halves,
    exact for any practical size) reduced locally.
    """

    name = "mindspore"

    def __init__(self) -> None:
        self._comm = sys.modules["mindspore.communication"]
        self._ms = sys.modules["mindspore"]

    def rank(self) -> int:
        return int(self._comm.get_rank())

    def world_size(self) -> int:
        return int(self._comm.get_group_size())

    def all_reduce(self, values: list[int], op: str) -> list[int]:
        # the CPU AllReduce only sums: gather every rank's values and reduce here
        rows = self.all_gather(values)
        columns = [[row[i] for row in rows] for i in range(len(values))]
        if op == "max":
            return [max(c) for c in columns]
        if op == "min":
            return [min(c) for c in columns]
        return [sum(c) for c in columns]

    def all_gather(self, values: list[int]) -> list[list[int]]:
        ms = self._ms
        split = [float(part) for v in values for part in divmod(int(v), 1 << 20)]
        rows = ms.ops.AllGather()(ms.Tensor([split], ms.float32)).asnumpy().tolist()
        return [[round(row[i]) * (1 << 20) + round(row[i + 1]) for i in range(0, len(row), 2)] for row in rows]


def _torch_ready() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported torch counts as "not initialised"
        return False


def _mindspore_ready() -> bool:
    comm = sys.modules.get("mindspore.communication")
    if comm is None:
        return False
    try:
        comm.get_group_size()
    except Exception:  # noqa: BLE001 - MindSpore raises RuntimeError before init()
        return False
    return True


def current(rank: int | None = None, world: int | None = None) -> Collective:
    """The collective of whatever the script initialised; ``Local`` (env RANK/WORLD_SIZE) otherwise."""
    if _torch_ready():
        return Torch()
    if _mindspore_ready():
        return MindSpore()
    from launchers.elastic.ranks import env

    if rank is None:
        rank = env.env_rank(0)
    if world is None:
        world = env.env_world(1)
    return Local(rank, world)


def message_prefix() -> str:
    """``mlaunch.elastic[rank N]`` for this process's messages; no rank when none is known (a plain script).

    Read from the environment only: it is used inside signal handlers.
    """
    from launchers.elastic.ranks import env

    rank = env.env_rank()
    return f"mlaunch.elastic[rank {rank}]" if rank >= 0 else "mlaunch.elastic"


def say(message: str) -> None:
    """``mlaunch.elastic[rank N]: message`` on stderr: ``launchers.log.say`` with this process's prefix."""
    log.say(message, who=message_prefix())
