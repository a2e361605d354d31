"""PyTorch helpers: everything a resumed run needs to continue *bit-identically*.

A checkpoint of the weights alone is not enough to continue the same run: the optimizer's
moments, the LR scheduler's position, the random streams (Python, NumPy, torch CPU and the
current accelerator) and the position in the data all shape the next step. ``capture``
collects them into one state dict (tensors are not copied: staging and saving copy them);
``restore`` puts them back and returns the step to continue from.

``ResumableSampler`` is a ``DataLoader`` sampler whose shuffling depends only on (seed,
epoch) and which can start in the middle of an epoch, so "data position" is two integers;
``ResumableLoader`` wraps the DataLoader so that position is what the loop consumed, also
with worker processes that prefetch ahead.

A ``DistributedDataParallel`` model resumes bit-identically with DDP's default buckets:
``capture`` records the gradient bucket layout DDP rebuilt after its first iteration (the
order in which gradients became ready), and ``restore`` starts the resumed DDP with that
layout (``ddp_buckets``); without it, a resumed process's first step would reduce in the
constructor's order, and a float sum over more than two ranks depends on the order.

Import this module only from training code: it imports torch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from launchers.elastic import ddp_buckets

try:  # NumPy is optional for torch; its RNG is captured when it is there
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is installed wherever torch's CPU wheel is
    _np = None  # type: ignore[assignment]


def rng_state() -> dict[str, Any]:
    """The state of every random stream this process uses."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if _np is not None:
        state["numpy"] = _np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_python_state(state["python"]))
    torch.set_rng_state(state["torch"])
    if _np is not None and "numpy" in state:
        _np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_state(value: Any) -> Any:
    # (version, tuple of 625 ints, gauss_next): tuples survive the shard format unchanged
    return (value[0], tuple(value[1]), value[2])


def capture(
    step: int,
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    data: Any = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One state dict for ``Checkpointer.stage/save``: the state *after* ``step`` finished.

    With a DDP ``model`` the first call after DDP's first backward is collective (it runs
    the bucket rebuild DDP's next forward would run): call it on every rank, as ``save``.

    ``data`` is whatever locates the next batch: an int, a ``ResumableSampler`` (its
    ``state_dict()`` is taken) or any object with ``state_dict()``.
    """
    state: dict[str, Any] = {"step": step, "rng": rng_state()}
    if model is not None:
        state["model"] = _unwrap(model).state_dict()
        buckets = ddp_buckets.layout(model) if isinstance(model, DistributedDataParallel) else None
        if buckets is not None:
            state["ddp_buckets"] = buckets
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if data is not None:
        state["data"] = data.state_dict() if hasattr(data, "state_dict") else data
    if extra:
        state["extra"] = extra
    return state


def restore(
    state: dict[str, Any],
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    data: Any = None,
) -> int:
    """Load what ``capture`` saved; returns the first step to run (saved step + 1)."""
    if model is not None and "model" in state:
        _unwrap(model).load_state_dict(state["model"])
    if isinstance(model, DistributedDataParallel) and state.get("ddp_buckets"):
        ddp_buckets.set_layout(model, state["ddp_buckets"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])
    if data is not None and "data" in state and hasattr(data, "load_state_dict"):
        data.load_state_dict(state["data"])
    if "rng" in state:
        set_rng_state(state["rng"])  # last: loading the rest must not consume random numbers after it
    return int(state["step"]) + 1


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """DDP/FSDP-style wrappers keep the real module in ``.module``: save that, without the prefix."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Shuffled (or ordered) indices of this rank's share, resumable at any position.

    The permutation of epoch *e* depends only on ``(seed, e)``; ranks take every
    ``num_replicas``-th index as ``DistributedSampler`` does. ``state_dict()`` is
    ``{"epoch", "position"}``; after ``load_state_dict`` the next ``__iter__`` continues
    from that position of that epoch.
    """

    def __init__(
        self, data: Sized | int, *, rank: int = 0, num_replicas: int = 1, shuffle: bool = True, seed: int = 0
    ) -> None:
        self.length = data if isinstance(data, int) else len(data)
        self.rank, self.num_replicas, self.shuffle, self.seed = rank, num_replicas, shuffle, seed
        self.epoch = 0
        self.position = 0  # indices of this epoch already handed out

    def _indices(self) -> list[int]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.length, generator=gen).tolist()
        else:
            order = list(range(self.length))
        return order[self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        indices = self._indices()
        while self.position < len(indices):
            index = indices[self.position]
            self.position += 1
            yield index
        self.epoch += 1
        self.position = 0

    def __len__(self) -> int:
        return len(self._indices()) - self.position

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


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
    ``prefetch_factor`` or ``persistent_workers``. (torchdata's ``StatefulDataLoader`` solves
    the same problem the same way.) Needs a fixed ``batch_size`` and an in-order loader. Its
    worker processes ignore stop signals sent to the whole process group (``StopSignalShield``).
    """

    def __init__(self, loader: torch.utils.data.DataLoader[Any]) -> None:
        sampler = loader.sampler
        if not isinstance(sampler, ResumableSampler) or loader.batch_size is None:
            raise TypeError("ResumableLoader needs DataLoader(..., sampler=ResumableSampler(...), batch_size=N)")
        self.loader, self.sampler, self.batch_size = loader, sampler, int(loader.batch_size)
        self.epoch, self.position = sampler.epoch, sampler.position  # consumed so far
        if loader.num_workers > 0 and not isinstance(loader.worker_init_fn, StopSignalShield):
            loader.worker_init_fn = StopSignalShield(loader.worker_init_fn)

    def __iter__(self) -> Iterator[Any]:
        # the sampler restarts from what was consumed, not from where prefetching left it
        self.sampler.load_state_dict(self.state_dict())
        epoch, total = self.epoch, len(self.sampler._indices())
        for batch in self.loader:
            self.position = min(self.position + self.batch_size, total)
            yield batch
        self.epoch, self.position = epoch + 1, 0

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.sampler.load_state_dict(state)
