"""``MlaunchStorageReader``: DCP's ``dcp.load`` reading a checkpoint mlaunch committed, resharded by DCP's planner.

Who uses it: ``Checkpointer.load_latest(into=state)`` (mlaunch's own API), and a DCP user's
``dcp.load(state, storage_reader=MlaunchStorageReader(ckpt_dir))``. Either way DCP's load
planner decides which pieces this rank needs for the tensors and DTensors of ``state``
(whatever world size or mesh saved them); this reader says what exists (``catalog``)
and copies just those pieces: each shard file is mapped, so only the pages a rank's pieces
lie on are read. Nothing is unpickled from the files: values come from the JSON headers
(DCP's planner then receives them as ``torch.save`` bytes made here, in memory, which is the
form its ``load_bytes`` takes).

Which step: ``step=`` if given, else the newest committed one when ``read_metadata`` runs;
every rank must read the same step, which the coordinator checks (``prepare_global_plan``).
"""

from __future__ import annotations

import dataclasses
import io
import mmap
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from launchers.elastic.dcp import catalog
from launchers.elastic.format import layout
from launchers.elastic.ranks import collective


def checkpoint_root(dir: str | os.PathLike[str] | None) -> Path:
    """The checkpoint directory: ``dir``, else ``$MLAUNCH_CHECKPOINT_DIR``, else ``output/ckpt``."""
    chosen = dir if dir is not None else os.environ.get("MLAUNCH_CHECKPOINT_DIR") or "output/ckpt"
    return Path(chosen).expanduser().absolute()


def step_of(checkpoint_id: str | os.PathLike[str] | int) -> int:
    """A step from DCP's ``checkpoint_id``: the step number, or a committed directory's name (``step_00000012``)."""
    text = str(checkpoint_id)
    parsed = layout.parse_step(Path(text).name)
    if parsed is not None:
        return parsed[0]
    if text.isascii() and text.isdigit():
        return int(text)
    raise ValueError(f"checkpoint_id {checkpoint_id!r} is neither a step number nor a step_NNNNNNNN directory")


class MlaunchStorageReader(StorageReader):
    """Reads a committed step of an mlaunch checkpoint directory for ``dcp.load``."""

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        step: int | None = None,
        trusted: bool = False,
        committed: layout.Committed | None = None,
    ) -> None:
        super().__init__()
        self.root = committed.path.parent if committed is not None else checkpoint_root(dir)
        self.step = committed.step if committed is not None else step
        self.trusted = trusted
        self._committed = committed
        self.catalog: catalog.Catalog | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.catalog = None
        if checkpoint_id is not None:
            path = Path(checkpoint_id)
            if layout.parse_step(path.name) is not None and path.parent != Path("."):
                self.root = path.parent.absolute()
            self.step = step_of(checkpoint_id)
            self._committed = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        path = Path(checkpoint_id)
        return layout.read_marker(path) is not None or bool(layout.committed(path))

    def chosen(self) -> layout.Committed:
        """The committed step this reader reads (the newest unless ``step`` names one)."""
        if self._committed is not None:
            return self._committed
        items = layout.committed(self.root)
        for item in items:
            if self.step is None or item.step == self.step:
                return item
        which = "no committed checkpoint" if self.step is None else f"no committed step {self.step}"
        raise FileNotFoundError(f"{which} in {self.root}")

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        coll = collective.current()
        self.catalog = catalog.build(self.chosen(), coll.rank(), coll.world_size())
        return self.catalog.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        assert self.catalog is not None
        return dataclasses.replace(plan, storage_data=self.catalog.step)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        steps = sorted({plan.storage_data for plan in plans})
        if len(steps) > 1:
            raise RuntimeError(f"the ranks would read different committed steps {steps}: pass step= to the reader")
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self.catalog is not None
        by_file: dict[Path, list[ReadItem]] = defaultdict(list)
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                value = catalog.materialize(self.catalog.values[item.storage_index.fqn], self.trusted)
                buffer = io.BytesIO()
                torch.save(value, buffer)  # our own value, in memory: DCP's load_bytes takes torch.save bytes
                buffer.seek(0)
                planner.load_bytes(item, buffer)
            else:
                by_file[self._piece(item).path].append(item)
        for path, items in by_file.items():
            self._copy_pieces(path, items, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _piece(self, item: ReadItem) -> catalog.Ref:
        assert self.catalog is not None
        index = item.storage_index
        return self.catalog.pieces[(index.fqn, tuple(index.offset or ()))]

    def _copy_pieces(self, path: Path, items: list[ReadItem], planner: LoadPlanner) -> None:
        """Copy every piece this rank reads from one shard file straight into its target (one mapping)."""
        try:
            with open(path, "rb") as fh:
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise catalog.Unreadable(f"{path}: {exc}") from None
        try:
            view = memoryview(mapped)
            for item in items:
                source = catalog.piece_tensor(self._piece(item), view)
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
                    source = source.narrow(dim, start, length)
                target = planner.resolve_tensor(item).detach()
                if target.shape != source.shape:
                    raise RuntimeError(
                        f"{item.dest_index.fqn}: piece of shape {list(source.shape)} for a "
                        f"target of {list(target.shape)}"
                    )
                target.copy_(source)
                planner.commit_tensor(item, target)
                del source, target
            view.release()
        finally:
            catalog.close_quietly(mapped)
