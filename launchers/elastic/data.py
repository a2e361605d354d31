"""The position in the data, resumable at the same or another world size (``ResumableSampler``, ``ResumableLoader``).

``ResumableSampler`` hands out the indices of one epoch's permutation, which depends only on
``(seed, epoch)``, striding over the ranks as ``DistributedSampler`` does: rank *r* of *R*
takes ``order[start + r :: R]``. Ranks that train in lockstep (data parallel: one batch per
rank per step) have each consumed the same count *p*, so together they consumed exactly
``order[start : start + p·R]`` — a prefix of the epoch. That makes the data position
independent of the world size: resumed with another ``num_replicas``, the sampler continues
the epoch at ``start + p·R``, striding over the new ranks, and no sample is skipped or
repeated. A resume whose length, seed or shuffling differ from what was saved is refused
(the permutation would differ: the position would mean other samples).

``ResumableLoader`` counts what the training loop *received* (a multi-process DataLoader
takes indices ahead of it); iterating the sampler directly from such a loader makes its
position run ahead of the loop, so capturing it then warns.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch

_IDENTITY = ("length", "seed", "shuffle")


class DataPositionError(ValueError):
    """A saved data position that does not describe this sampler's data (length, seed or shuffling differ)."""


def _prefetching_workers() -> int:
    """``num_workers`` of a multi-process DataLoader iterator asking for indices (up the stack), else 0."""
    module = sys.modules.get("torch.utils.data.dataloader")
    prefetcher = getattr(module, "_MultiProcessingDataLoaderIter", None)
    frame: Any = sys._getframe(1)
    for _ in range(12):
        if frame is None or prefetcher is None:
            return 0
        owner = frame.f_locals.get("self")
        if isinstance(owner, prefetcher):
            return int(getattr(owner, "_num_workers", 1))
        frame = frame.f_back
    return 0


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Shuffled (or ordered) indices of this rank's share, resumable at any position and world size.

    ``state_dict()`` is ``{"epoch", "position", "start", "num_replicas", "length", "seed",
    "shuffle"}``; after ``load_state_dict`` the next ``__iter__`` continues from that position
    of that epoch (converted to this sampler's ``num_replicas`` if it differs).
    """

    def __init__(
        self, data: Sized | int, *, rank: int = 0, num_replicas: int = 1, shuffle: bool = True, seed: int = 0
    ) -> None:
        self.length = data if isinstance(data, int) else len(data)
        self.rank, self.num_replicas, self.shuffle, self.seed = rank, num_replicas, shuffle, seed
        self.epoch = 0
        self.start = 0  # where this epoch's shares begin in its permutation (a resume at another world size)
        self.position = 0  # indices of this epoch already handed out
        self.wrapped = False  # a ResumableLoader counts what the loop consumed
        self._prefetched_by = 0  # num_workers of a DataLoader iterating this sampler directly

    def _order(self) -> list[int]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            return list(torch.randperm(self.length, generator=gen).tolist())
        return list(range(self.length))

    def _indices(self) -> list[int]:
        return self._order()[self.start :][self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        if not self.wrapped:
            self._prefetched_by = _prefetching_workers()
        indices = self._indices()
        while self.position < len(indices):
            index = indices[self.position]
            self.position += 1
            yield index
        self.epoch, self.start, self.position = self.epoch + 1, 0, 0
        self._prefetched_by = 0

    def __len__(self) -> int:
        return len(self._indices()) - self.position

    def state_dict(self) -> dict[str, Any]:
        if self._prefetched_by and self.position:
            warnings.warn(
                f"ResumableSampler is iterated directly by a DataLoader with {self._prefetched_by} worker processes, "
                "which take indices ahead of the training loop: this position is past the batches the loop received "
                "(a resume would skip them). Wrap the loader (ResumableLoader(DataLoader(...))) and capture that.",
                RuntimeWarning,
                stacklevel=2,
            )
        return {
            "epoch": self.epoch,
            "position": self.position,
            "start": self.start,
            "num_replicas": self.num_replicas,
            "length": self.length,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = {"length": self.length, "seed": self.seed, "shuffle": self.shuffle}
        differ = [f"{k} {state[k]!r} (now {mine[k]!r})" for k in _IDENTITY if k in state and state[k] != mine[k]]
        if differ:
            raise DataPositionError(
                "the saved data position belongs to other data: saved " + ", ".join(differ) + "; resuming there "
                "would skip or repeat samples (start the epoch over explicitly if that is intended)"
            )
        epoch, position, start = int(state["epoch"]), int(state["position"]), int(state.get("start", 0))
        saved_replicas = int(state.get("num_replicas", self.num_replicas))
        if saved_replicas != self.num_replicas:  # every rank consumed `position`: a prefix of the epoch
            start, position = min(self.length, start + position * saved_replicas), 0
        if start >= self.length:
            epoch, start, position = epoch + 1, 0, 0
        self.epoch, self.start, self.position = epoch, start, position


class StopSignalShield:
    """A DataLoader ``worker_init_fn`` that shields the worker from stop signals not sent by its rank.

    A stop signal that reaches the whole process group — Slurm's ``scancel --signal=TERM`` or
    preemption, ``kill -- -PGID``, Ctrl-C in a terminal — would kill the DataLoader's worker
    processes too (torch's worker handler re-raises SIGTERM unless it came from the parent),
    and torch then fails the rank mid-step instead of letting it stop at the step boundary and
    save. The worker blocks SIGTERM and SIGINT and a thread takes them with ``sigwaitinfo``:
    one sent by its parent (the rank: ``multiprocessing``'s ``terminate()`` when it shuts the
    workers down) ends the worker as torch's handler would; one sent by anyone else is
    dropped. Then the user's ``worker_init_fn`` runs. Picklable for the spawn context.
    """

    def __init__(self, inner: Callable[[int], None] | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        import os
        import signal
        import threading

        stops = {signal.SIGTERM, signal.SIGINT}
        if hasattr(signal, "sigwaitinfo"):
            parent = os.getppid()
            signal.pthread_sigmask(signal.SIG_BLOCK, stops)

            def take() -> None:
                while True:
                    info = signal.sigwaitinfo(stops)
                    if info.si_pid == parent and info.si_signo == signal.SIGTERM:
                        os._exit(0)  # what torch's worker handler does on its parent's SIGTERM

            threading.Thread(target=take, name="mlaunch-stop-shield", daemon=True).start()
        if self.inner is not None:
            self.inner(worker_id)


class ResumableLoader:
    """A ``DataLoader`` over a ``ResumableSampler`` whose position is what the loop *consumed*.

    With worker processes (``num_workers > 0``) the DataLoader takes indices from its sampler
    ``num_workers × prefetch_factor`` batches ahead, so the sampler's own position is past the
    step being saved. Iterate this wrapper instead of the loader and pass it as ``data=`` to
    ``capture``/``restore``: it counts the batches handed to the training loop, and a resume
    continues with the first batch the loop never received, whatever ``num_workers``,
    ``prefetch_factor`` or ``persistent_workers`` — and at another world size, as the sampler
    does. (torchdata's ``StatefulDataLoader`` solves the first problem the same way.) Needs a
    fixed ``batch_size`` and an in-order loader. Its worker processes ignore stop signals sent
    to the whole process group (``StopSignalShield``).
    """

    def __init__(self, loader: torch.utils.data.DataLoader[Any]) -> None:
        sampler = loader.sampler
        if not isinstance(sampler, ResumableSampler) or loader.batch_size is None:
            raise TypeError("ResumableLoader needs DataLoader(..., sampler=ResumableSampler(...), batch_size=N)")
        self.loader, self.sampler, self.batch_size = loader, sampler, int(loader.batch_size)
        sampler.wrapped = True
        self.epoch, self.start, self.position = sampler.epoch, sampler.start, sampler.position  # consumed so far
        if loader.num_workers > 0 and not isinstance(loader.worker_init_fn, StopSignalShield):
            loader.worker_init_fn = StopSignalShield(loader.worker_init_fn)

    def __iter__(self) -> Iterator[Any]:
        # the sampler restarts from what was consumed, not from where prefetching left it
        self.sampler.load_state_dict(self.state_dict())
        epoch, total = self.epoch, len(self.sampler._indices())
        if 0 < total <= self.position:  # the last epoch was consumed by a loop that stopped after len() batches
            self.epoch, self.start, self.position = epoch + 1, 0, 0  # (Lightning): its generator never ended
            self.sampler.load_state_dict(self.state_dict())
            epoch, total = self.epoch, len(self.sampler._indices())
        for batch in self.loader:
            self.position = min(self.position + self.batch_size, total)
            yield batch
        self.epoch, self.start, self.position = epoch + 1, 0, 0

    def __len__(self) -> int:
        """Batches the next ``iter()`` yields: the rest of this epoch, or the next epoch when it is consumed."""
        sampler, rank, replicas = self.sampler, self.sampler.rank, self.sampler.num_replicas

        def share(start: int) -> int:  # len(order[start:][rank::replicas])
            return max(0, -(-(sampler.length - start - rank) // replicas))

        left = share(self.start) - self.position
        if left <= 0:
            left = share(0)
        return left // self.batch_size if self.loader.drop_last else -(-left // self.batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "epoch": self.epoch, "start": self.start, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)  # converted to this world size there
        self.epoch, self.start, self.position = self.sampler.epoch, self.sampler.start, self.sampler.position
