"""``MlaunchStorageWriter``: ``dcp.save`` / ``dcp.async_save`` into mlaunch's checkpoint layout.

A DCP user keeps calling DCP and gets what ``Checkpointer.save``/``stage`` give:

- ``MlaunchStorageWriter(dir, step=N)``: every rank writes its items into its own shard file
  of ``step_N.tmp/`` (mlaunch's format: a JSON header, tensors as raw bytes, no pickle) and
  the coordinator commits once every rank has (``layout.commit``: the ``COMMITTED`` marker
  last, then the rename) and keeps the newest ``keep``. A save that fails on any rank is
  never committed, and resume (``Checkpointer.load_latest``, ``MlaunchStorageReader``)
  never sees it.
- ``MlaunchStorageWriter(step=N, stage=True)``: the rank's items go to its shared-memory
  slot instead (as ``Checkpointer.stage``): nothing is written to disk, and if a rank is
  killed mlaunch's agent persists and commits the newest step every rank staged (flash
  save), or persists it in the background (``checkpoint.persist_every``).

The step comes from ``step=`` or DCP's ``checkpoint_id`` (``dcp.save(..., checkpoint_id=12)``).
Values that are not tensors are stored as JSON (``plain``): what DCP's default planner would
pickle, this writer refuses unless it is plain data (or ``trusted=True``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from launchers.elastic.dcp.reader import checkpoint_root, step_of
from launchers.elastic.format import layout, shardfile, tensors
from launchers.elastic.ipc import commit_tail, rank_segment
from launchers.elastic.ranks import collective, env
from launchers.elastic.storage import durable


class MlaunchStorageWriter(StorageWriter):
    """Writes (or stages) one step for ``dcp.save``; the coordinator commits it atomically."""

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        step: int | None = None,
        stage: bool = False,
        keep: int | None = None,
        trusted: bool = False,
    ) -> None:
        super().__init__()
        self.root = checkpoint_root(dir)
        self.step = step
        self.stage = stage
        self.keep = keep if keep is not None else env.checkpoint_keep()
        self.trusted = trusted
        self.owner = os.getpid()  # staging goes to this process's own segment only
        self.rank = 0
        self.world = 1
        self.skip = False  # the step is committed already

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.step = step_of(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # chosen explicitly (storage_writer=...), never guessed from a path

    @property
    def final(self) -> Path:
        return self.root / layout.step_name(self._step())

    @property
    def tmp(self) -> Path:
        return self.root / (layout.step_name(self._step()) + ".tmp")

    def _step(self) -> int:
        if self.step is None:
            raise ValueError("MlaunchStorageWriter needs the step: step=N, or dcp.save(..., checkpoint_id=N)")
        return self.step

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        coll = collective.current()
        self.rank, self.world = coll.rank(), coll.world_size()
        self._step()
        if self.stage:
            if os.getpid() != self.owner:
                raise RuntimeError("stage=True writes this rank's shared memory: use dcp.save or a thread async_save")
            return
        self.skip = layout.read_marker(self.final) is not None
        if is_coordinator and not self.skip:  # before any rank writes: DCP plans first, then every rank writes
            self.root.mkdir(parents=True, exist_ok=True)
            if self.tmp.exists():
                layout.remove_tree(self.tmp)  # a stale partial save of this step: never reuse it
            self.tmp.mkdir()
            durable.fsync_dir(self.root)
        rank_segment.update_status(self.rank, self.world, saving_step=self._step())

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        flat = {item.index.fqn: self._value(item, planner) for item in plan.items}
        meta = {"step": self._step(), "rank": self.rank, "world_size": self.world, "how": "dcp"}
        # staged: tensors on an accelerator leave it without blocking (pinned memory, a side stream: ipc.device_stage)
        enc = shardfile.encode(flat, meta, trusted=self.trusted, on_device=self.stage)
        size = enc.size
        if self.stage:
            self._stage(enc)
        elif not self.skip:
            self.tmp.mkdir(parents=True, exist_ok=True)
            shardfile.write_file(self.tmp / layout.shard_name(self.rank), enc)
            durable.fsync_dir(self.tmp)
        done: Future[list[WriteResult]] = Future()
        done.set_result([WriteResult(item.index, 0, {"rank": self.rank, "bytes": size}) for item in plan.items])
        return done

    def _value(self, item: WriteItem, planner: SavePlanner) -> Any:
        if item.type == WriteItemType.BYTE_IO:
            lookup = getattr(planner, "lookup_object", None)
            if lookup is None:
                raise TypeError(
                    "MlaunchStorageWriter stores values as JSON: use DCP's DefaultSavePlanner (or a subclass)"
                )
            return lookup(item.index)
        local = planner.resolve_data(item)
        if item.type == WriteItemType.SHARD:
            assert item.tensor_data is not None
            chunk = item.tensor_data.chunk
            meta = {
                "shape": list(item.tensor_data.size),
                "dtype": str(item.tensor_data.properties.dtype).removeprefix("torch."),
                "offsets": list(chunk.offsets),
                "sizes": list(chunk.sizes),
                "placements": [],
                "stored": True,
            }
            return tensors.DShard(local, meta)
        return local

    def _stage(self, enc: shardfile.Encoded) -> None:
        commit_tail.stage_image(self.rank, self.world, self.root, self.keep, self._step(), enc)  # as Checkpointer.stage

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        if self.stage or self.skip:
            return
        started = time.monotonic()
        sizes = {int(r.storage_data["rank"]): int(r.storage_data["bytes"]) for rank in results for r in rank}
        for rank in range(self.world):
            sizes.setdefault(rank, (self.tmp / layout.shard_name(rank)).stat().st_size)  # a rank with no items
        committed = layout.commit(self.tmp, self.final, self._step(), self.world, sizes, source="dcp")
        commit_tail.after_commit(
            self.root,
            self.keep,
            self._step(),
            rank=self.rank,
            world=self.world,
            coordinator=True,
            seconds=time.monotonic() - started,
            size=sizes.get(self.rank, 0),
            path=committed,
        )
