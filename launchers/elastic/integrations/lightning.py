"""PyTorch Lightning: ``L.Trainer(callbacks=[MlaunchCallback(), ModelCheckpoint(save_last=True, ...)])``.

::

    from launchers.elastic.integrations.lightning import MlaunchCallback

    trainer = L.Trainer(..., callbacks=[MlaunchCallback(), ModelCheckpoint(dirpath="ckpt", save_last=True)])
    trainer.fit(model, data, ckpt_path="last")

What the callback does:

- **SIGTERM**: Lightning's ``fit()`` installs a SIGTERM handler that runs ``dist.broadcast`` inside the
  signal handler — with ranks in other collectives that deadlocks until the platform's SIGKILL. The
  callback puts mlaunch's flag back in ``on_train_start``; after each training batch every rank checks
  it (one all-reduce) and all stop at the same step: ``trainer.save_checkpoint`` writes the
  ``ModelCheckpoint``'s ``last.ckpt``, then every rank leaves with 143.
- **kill -9 / crash**: after each training batch rank 0 stages the checkpoint Lightning would write at
  that point (its own ``dump_checkpoint``), every rank its RNG state. mlaunch commits the newest step
  every rank staged. When the callback is created again (before ``fit`` looks for ``"last"``), that step
  is written as the ``last.ckpt`` if it is newer than the one there, so ``ckpt_path="last"`` resumes it.
- **RNG and data**: the checkpoint carries every rank's Python/NumPy/torch RNG state (restored at the
  first batch of the resumed run). Lightning resumes the data position mid-epoch only for a dataloader
  with ``state_dict``/``load_state_dict``; for a plain ``DataLoader`` (shuffled or not, with the
  ``DistributedSampler`` Lightning injects) the callback does it at ``on_train_start``, as HF's ``Trainer``
  does: the sampler's epoch set, the batches the loop received skipped by index (``resume_data``). Where
  that cannot be exact (an ``IterableDataset`` without state; a ``RandomSampler`` in one process, which
  draws its order from an RNG at each epoch start) it says so once, at the start of training.
- **the end**: the rank reports completion to mlaunch and the process group ends at exit.

Limits: data-parallel strategies (``ddp``, one device): sharded strategies (FSDP, DeepSpeed) hold state
rank 0 cannot dump alone. The staged checkpoint may hold any object Lightning's does (hyperparameters),
so it is staged with ``trusted=True``: keep ``checkpoint.dir`` writable by you alone, as ``last.ckpt``
(a pickle, loaded with ``weights_only=False``) already must be.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from launchers.elastic import ddp_buckets
from launchers.elastic.integrations._session import Session, rank_world, write_once
from launchers.elastic.integrations._structure import record, restore
from launchers.elastic.ranks import collective

__all__ = ["MlaunchCallback"]

_HINT = "lightning-last.json"  # in mlaunch's checkpoint directory: where the ModelCheckpoint's last.ckpt is


class MlaunchCallback(Callback):
    """Nothing lost on SIGTERM or kill -9 under mlaunch, in Lightning's own checkpoint format."""

    def __init__(self) -> None:
        self.session = Session(trusted=True)
        self.session.install()
        self.last: Path | None = None
        self._dumping = False
        self._rng: dict[str, Any] | None = None  # this rank's RNG state to put back at the first batch
        self._buckets: list[list[int]] | None = None  # DDP's rebuilt gradient buckets (see ddp_buckets)
        self.resumed_from = self._materialise()

    # -- start: mlaunch's commit as last.ckpt (before fit resolves ckpt_path="last") --
    def _materialise(self) -> int | None:
        hint = self.session.ckpt.dir / _HINT
        if not self.session.under_mlaunch or not hint.is_file():
            return None
        last = Path(json.loads(hint.read_text())["last"])
        # every last*.ckpt: a ModelCheckpoint that did not write the last one itself writes last-v1.ckpt beside it,
        # and Lightning's ckpt_path="last" resumes from the newest of them
        native = [_native_step(path) for path in last.parent.glob(f"{last.stem}*{last.suffix}")]
        got = self.session.newer_commit(max((step for step in native if step is not None), default=None))
        if got is None:
            return None
        step, own = got
        write_once(last, step, lambda tmp: self._write(tmp, step, own), directory=False)
        return step

    def _write(self, tmp: Path, step: int, own: Any) -> None:
        """Rank 0: the staged checkpoint with every rank's RNG state, written as ``last.ckpt``."""
        save(last_checkpoint(self.session.every_rank(step, own), self.state_key), tmp)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.install()  # fit() wrapped our handler in one that runs a collective
        count_the_epoch_resumed_into(trainer.fit_loop)
        resume_data(trainer)  # a plain DataLoader resumes at the first batch the loop never received
        if self._rng is not None and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._new_epoch_after_rng(trainer)
        if self._buckets is not None and isinstance(trainer.strategy.model, DistributedDataParallel):
            ddp_buckets.set_layout(trainer.strategy.model, self._buckets)  # the resumed step reduces as before
        self.last = _last_path(trainer)  # every ModelCheckpoint has resolved its dirpath by now
        if self.last is not None and trainer.is_global_zero and self.session.under_mlaunch:
            self.session.ckpt.dir.mkdir(parents=True, exist_ok=True)
            hint = self.session.ckpt.dir / _HINT
            tmp = hint.with_suffix(".tmp")
            tmp.write_text(json.dumps({"last": str(self.last)}))
            os.replace(tmp, hint)

    def _new_epoch_after_rng(self, trainer: pl.Trainer) -> None:
        """Resumed at an epoch's end: the RNG state first, then the next epoch's iterator, as in the
        uninterrupted run (a ``DataLoader`` without ``generator=`` draws a seed from torch's global RNG when
        its iterator starts; mid-epoch no iterator starts, so there the state waits for the first batch)."""
        assert self._rng is not None
        _set_rng_state(self._rng)
        self._rng = None
        combined = getattr(trainer.fit_loop, "_combined_loader", None)
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if combined is None or fetcher is None:
            return
        for loader in combined.flattened:
            _set_sampler_epoch(loader, trainer.current_epoch)
        iter(fetcher)

    # -- RNG: in the checkpoint for every rank, put back at the first batch ------------
    def state_dict(self) -> dict[str, Any]:
        own = _rng_state()
        if self._dumping:  # staging on rank 0 alone: the other ranks stage their own
            return {"rng": {str(rank_world()[0]): own}, "ddp_buckets": self._buckets}
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            every: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(every, own)  # save_checkpoint runs on every rank
            return {"rng": {str(r): s for r, s in enumerate(every)}, "ddp_buckets": self._buckets}
        return {"rng": {"0": own}, "ddp_buckets": self._buckets}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rng = state_dict.get("rng", {}).get(str(rank_world()[0]))
        self._buckets = state_dict.get("ddp_buckets")

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, i: int) -> None:
        if self._rng is not None:
            _set_rng_state(self._rng)
            self._rng = None

    # -- each batch: stage, then agree on a stop ---------------------------------------
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        step = trainer.global_step
        if isinstance(trainer.strategy.model, DistributedDataParallel):
            self._buckets = ddp_buckets.layout(trainer.strategy.model) or self._buckets  # every rank: collective once
        if self.session.wants_stage():
            self.session.stage_built(step, lambda: self._capture(trainer, step))
        if self.session.should_stop(step):
            if self.last is not None:
                trainer.save_checkpoint(self.last)  # every rank; rank 0 writes, then a barrier
            self.session.stop()

    def _capture(self, trainer: pl.Trainer, step: int) -> dict[str, Any]:
        state: dict[str, Any] = {"step": step, "rng": _rng_state()}
        if trainer.is_global_zero:
            self._dumping = True
            try:
                state["checkpoint"] = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            finally:
                self._dumping = False
            state["structure"] = record(state["checkpoint"])  # tied weights, _metadata: staging loses them
        return state

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.finished()


def last_checkpoint(states: list[Any], state_key: str) -> dict[str, Any]:
    """``last.ckpt`` from every rank's staged state (by rank): rank 0's dump of the checkpoint, its tied
    tensors shared again, with every rank's RNG state in the callback's own entry."""
    checkpoint: dict[str, Any] = {}
    for state in states:
        if "checkpoint" in state:
            checkpoint = restore(state["checkpoint"], state.get("structure"))
    own = checkpoint.setdefault("callbacks", {}).setdefault(state_key, {})
    own["rng"] = {str(rank): state["rng"] for rank, state in enumerate(states)}
    return checkpoint


def save(checkpoint: dict[str, Any], path: Path) -> None:
    """Write ``checkpoint`` as ``trainer.save_checkpoint`` does (``TorchCheckpointIO``: ``torch.save`` into a
    buffer, whose records are named ``archive/``, then the file): the same bytes for the same checkpoint."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    TorchCheckpointIO().save_checkpoint(checkpoint, path)


def count_the_epoch_resumed_into(loop: Any) -> None:
    """Count the epoch a resume from an epoch's last batch goes on into, as the uninterrupted run counts it.

    A checkpoint written in ``on_train_batch_end`` of an epoch's last batch restores as "mid-epoch"; Lightning
    (2.5–2.6) then counts that epoch processed and completed, and its next ``on_advance_start`` skips counting
    the new epoch ready and started (the restart stage is still "mid-epoch"). The run goes on with its epoch
    counters one short: when it is stopped at the last batch of that epoch too, its checkpoint looks like a
    finished epoch, and the resume after it runs the next epoch with the sampler's epoch of the one before
    (``DistributedSampler.set_epoch(processed)``): the same order twice, a run that ends elsewhere (kill -9
    at an epoch's end, then SIGTERM at the next epoch's end: ``tests/test_trainers.py``).
    """
    progress = loop.epoch_progress.total
    if (
        getattr(loop, "restarted_mid_epoch", False)
        and loop.epoch_loop.batch_progress.is_last_batch
        and progress.ready == progress.started == progress.processed
    ):
        loop.epoch_progress.increment_ready()
        loop.epoch_progress.increment_started()


def resume_data(trainer: pl.Trainer) -> None:
    """Resume each plain train ``DataLoader`` exactly where the restored step left its epoch, as HF's
    ``Trainer`` does: the sampler's epoch set (``DistributedSampler.set_epoch``), the batches the loop
    received before the checkpoint skipped by index (no data is loaded for them), then a fresh iterator.

    Lightning itself restores the position only of a dataloader with ``state_dict``; a plain one restarts
    its epoch from the first batch while the step counters go on. Said once, at the start of training,
    for what cannot be resumed exactly this way (an ``IterableDataset`` without state, a ``RandomSampler``
    that draws its order from an RNG at each epoch start).
    """
    loop = trainer.fit_loop
    combined = getattr(loop, "_combined_loader", None)
    if combined is None:
        return
    progress = loop.epoch_loop.batch_progress
    received = 0 if progress.is_last_batch else int(progress.current.ready)  # the next epoch starts afresh
    skipped = False
    for loader in combined.flattened:
        if not isinstance(loader, DataLoader) or callable(getattr(loader, "load_state_dict", None)):
            continue  # Lightning restores a stateful loader's position itself
        problem = _inexact(loader)
        if problem and trainer.is_global_zero:
            collective.say(f"MlaunchCallback: {problem}")
        if received and not problem:
            _set_sampler_epoch(loader, trainer.current_epoch)
            _skip_first(loader, received)
            skipped = True
    if skipped and loop._data_fetcher is not None:
        iter(loop._data_fetcher)  # the iterator setup_data made began the epoch at its first batch
        if trainer.is_global_zero:
            collective.say(f"resuming the train dataloader at batch {received} of epoch {trainer.current_epoch}")


def _inexact(loader: DataLoader) -> str | None:
    """Why a mid-epoch resume of ``loader`` cannot be exact, or None."""
    if isinstance(loader.dataset, IterableDataset):
        return (
            "the train dataloader's IterableDataset has no state_dict/load_state_dict: a resume mid-epoch restarts "
            "its iteration (give it state, or use a stateful dataloader, for an exact resume)"
        )
    sampler = getattr(loader.batch_sampler, "sampler", loader.sampler)
    if isinstance(sampler, RandomSampler):
        return (
            "the train dataloader's RandomSampler draws its order from an RNG at each epoch start: a resume mid-epoch "
            "continues in another order (several devices get Lightning's DistributedSampler, which is exact; "
            "or use launchers.elastic.pytorch.ResumableSampler)"
        )
    return None


class _SkipFirst:
    """A batch sampler that leaves out the first ``n`` batches of ``inner`` once, then puts ``inner`` back."""

    def __init__(self, loader: DataLoader, inner: Any, n: int) -> None:
        self.loader, self.inner, self.n = loader, inner, n
        self.sampler = getattr(inner, "sampler", None)
        self.batch_size = getattr(inner, "batch_size", None)
        self.drop_last = getattr(inner, "drop_last", False)

    def __iter__(self) -> Any:
        object.__setattr__(self.loader, "batch_sampler", self.inner)  # the next epoch iterates in full
        return itertools.islice(iter(self.inner), self.n, None)

    def __len__(self) -> int:
        return len(self.inner)  # Lightning counts the skipped batches as received (its restored progress)


def _skip_first(loader: DataLoader, n: int) -> None:
    # DataLoader refuses a new batch_sampler after __init__; its iterator reads the attribute when it starts
    object.__setattr__(loader, "batch_sampler", _SkipFirst(loader, loader.batch_sampler, n))


def _last_path(trainer: pl.Trainer) -> Path | None:
    """The ``last.ckpt`` of the first ``ModelCheckpoint(save_last=True)`` (None without one)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.save_last and callback.dirpath:
            return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
    return None


def _native_step(last: Path) -> int | None:
    if not last.is_file():
        return None
    try:
        return int(torch.load(last, map_location="cpu", weights_only=False, mmap=True)["global_step"])
    except Exception:  # noqa: BLE001 - a torn or foreign file: mlaunch's commit is better than nothing
        return None


def _rng_state() -> dict[str, Any]:
    """Python/NumPy/torch RNG states in types ``torch.load(weights_only=True)`` accepts (Lightning's default)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    keys_tensor = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    numpy_state = [str(name), keys_tensor, int(pos), int(has_gauss), float(cached)]
    return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.int64).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
