"""PyTorch helpers: everything a resumed run needs to continue *bit-identically*.

A checkpoint of the weights alone is not enough to continue the same run: the optimizer's
moments, the LR scheduler's position, the random streams (Python, NumPy, torch CPU and the
current accelerator) and the position in the data all shape the next step. ``capture``
collects them into one state dict (tensors are not copied: staging and saving copy them);
``restore`` puts them back and returns the step to continue from.

``ResumableSampler`` is a ``DataLoader`` sampler whose shuffling depends only on (seed,
epoch) and which can start in the middle of an epoch, also at another world size;
``ResumableLoader`` wraps the DataLoader so that position is what the loop consumed, also
with worker processes that prefetch ahead (both in ``launchers.elastic.data``).

Sharded state (FSDP2, DTensor): ``Checkpointer.stage/save`` take ``get_state_dict(model,
optimizer)`` as it is and ``Checkpointer.load_latest(into=state)`` reshards it; a script that
calls DCP itself plugs ``MlaunchStorageWriter`` / ``MlaunchStorageReader`` into
``dcp.save``/``dcp.async_save``/``dcp.load`` (mlaunch's commit, flash save and layout).

A ``DistributedDataParallel`` model resumes bit-identically with DDP's default buckets:
``capture`` records the gradient bucket layout DDP rebuilt after its first iteration (the
order in which gradients became ready), and ``restore`` starts the resumed DDP with that
layout (``ddp_buckets``); without it, a resumed process's first step would reduce in the
constructor's order, and a float sum over more than two ranks depends on the order.

Import this module only from training code: it imports torch.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from launchers.elastic import ddp_buckets
from launchers.elastic.data import DataPositionError as DataPositionError
from launchers.elastic.data import ResumableLoader as ResumableLoader
from launchers.elastic.data import ResumableSampler as ResumableSampler
from launchers.elastic.data import StopSignalShield as StopSignalShield

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


# DCP's storage plug-ins import torch.distributed.checkpoint (~0.6 s): loaded when asked for.
_DCP_STORAGE = {"MlaunchStorageReader": "dcp.reader", "MlaunchStorageWriter": "dcp.writer"}


def __getattr__(name: str) -> Any:
    module = _DCP_STORAGE.get(name)
    if module is None:
        raise AttributeError(f"module 'launchers.elastic.pytorch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"launchers.elastic.{module}"), name)
    globals()[name] = value
    return value
