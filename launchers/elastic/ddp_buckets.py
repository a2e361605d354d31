"""DDP's gradient bucket layout: read it from a running model, start a resumed model with it.

``DistributedDataParallel`` assigns parameters to gradient buckets at construction, in
reverse definition order, then *rebuilds* the buckets once, after the first iteration, in
the order the gradients became ready. Each bucket is all-reduced as one flat buffer, and
with more than two ranks the summation order of an element depends on where it lies in that
buffer (ring/halving algorithms reduce chunks in different orders), so the layout decides the
last bits of every gradient. A resumed process's first step runs with the constructor's
layout while the uninterrupted run used the rebuilt one: the runs differ from there on.

``layout(model)`` returns the rebuilt layout (parameter indices per bucket, in reduction
order); ``set_layout(model, buckets)`` rebuilds the model's reducer with it, exactly as
``DistributedDataParallel.__setstate__`` builds a reducer, so the resumed first step reduces
exactly like the uninterrupted run. The reducer's own rebuild after that step computes the
same layout again (the ready order of a backward pass does not change). Uses DDP internals
(``reducer``, ``_ddp_init_helper``, ``_build_params_for_reducer``); when they are missing
nothing happens and the resumed run is only close (the last bits) to the uninterrupted one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from launchers.elastic.ranks.collective import say

_CACHE = "_mlaunch_ddp_buckets"  # attribute on the DDP object: the layout, once it is final
_UNREADABLE = "_mlaunch_ddp_buckets_unreadable"


UNREADABLE = (
    "cannot read DDP's gradient bucket layout in this torch: a resumed run may differ from an uninterrupted one "
    "in the last bits (with more than two ranks); DistributedDataParallel(..., find_unused_parameters=True) "
    "keeps the constructor's layout in every run, which makes it exact (at a graph traversal per step)"
)
UNSETTABLE = UNREADABLE.replace("cannot read", "cannot set")


def rebuilt_layout(model: DistributedDataParallel) -> list[list[int]] | None:
    """The layout DDP rebuilt after its first iteration, read without a collective; None before the rebuild
    (or where it cannot be read: ``unreadable``). Cached once found."""
    cached = getattr(model, _CACHE, None)
    if cached is not None:
        return cached
    if unreadable(model):
        return None
    try:
        if not has_rebuilt(model):
            return None
        buckets = current_layout(model)
    except (AttributeError, KeyError, RuntimeError, TypeError):
        setattr(model, _UNREADABLE, True)
        return None
    setattr(model, _CACHE, buckets)
    return buckets


def has_rebuilt(model: DistributedDataParallel) -> bool:
    """Whether DDP has rebuilt its buckets: its own flag, set the moment it rebuilds (second forward).

    DDP's logging data says so only from the forward after that (it is refreshed before the rebuild), so a
    step staged right after the rebuilding step had no layout and its resume reduced with the constructor's.
    """
    flag = getattr(model, "_has_rebuilt_buckets", None)
    if isinstance(flag, bool):
        return flag
    return bool(model._get_ddp_logging_data().get("has_rebuilt_buckets"))


def rebuild_pending(model: DistributedDataParallel) -> bool:
    """True between DDP's first forward and its rebuild: the layout its next step reduces with is not known yet
    (DDP computes it from the order the first backward's gradients became ready, inside the next forward)."""
    if not getattr(model, "_lazy_init_ran", False) or has_rebuilt(model):
        return False
    return bool(model.static_graph or not model.find_unused_parameters)  # find_unused keeps the constructor's


def unreadable(model: DistributedDataParallel) -> bool:
    """True when this model's layout cannot be read (no C++ reducer, or its internals are not the ones used here)."""
    if getattr(model, _UNREADABLE, False):
        return True
    return getattr(model, "reducer", None) is None or bool(getattr(model, "_use_python_reducer", False))


def current_layout(model: DistributedDataParallel) -> list[list[int]]:
    """The layout the reducer holds now (parameter indices per bucket, in reduction order)."""
    index = {id(p): i for i, p in enumerate(model._build_params_for_reducer()[0])}
    return [[index[id(p)] for p in bucket.parameters()] for bucket in model.reducer._get_zeros_like_grad_buckets()]


def layout(model: DistributedDataParallel) -> list[list[int]] | None:
    """The bucket layout the next step reduces with, once DDP has rebuilt it; else None.

    The first call after the first backward runs the pending rebuild (DDP's next forward
    would run it): collective then, as the rebuild broadcasts rank 0's layout.
    """
    cached = getattr(model, _CACHE, None)
    reducer = getattr(model, "reducer", None)
    if cached is not None or reducer is None or getattr(model, "_use_python_reducer", False):
        return cached
    try:
        rebuilt = reducer._rebuild_buckets()
        if not rebuilt and not has_rebuilt(model):
            return None  # no backward yet: the next step still uses the constructor's layout
        buckets = current_layout(model)
    except (AttributeError, KeyError, RuntimeError, TypeError):
        return None
    setattr(model, _CACHE, buckets)
    return buckets


def set_layout(model: DistributedDataParallel, buckets: list[list[int]], *, quiet: bool = False) -> bool:
    """Rebuild ``model``'s reducer with ``buckets`` (from ``layout``); False when it cannot (said unless quiet)."""
    if getattr(model, "reducer", None) is None or getattr(model, "_use_python_reducer", False):
        return False
    try:
        params, expect_sparse = model._build_params_for_reducer()
        order = sorted(i for bucket in buckets for i in bucket)
        if order != list(range(len(params))):
            if not quiet:
                say(f"not restoring DDP's bucket layout: it names {len(order)} parameters, the model has {len(params)}")
            return False
        names = model._build_debug_param_to_name_mapping(params)
        with _assignment(buckets, model.bucket_bytes_cap):
            model._ddp_init_helper(params, expect_sparse, names, model.static_graph)
        if model.static_graph:
            model.reducer._set_static_graph()
        for hook, state in getattr(model, "_comm_hooks", []):  # hooks lived on the old reducer
            dist._register_comm_hook(model.reducer, state, hook)
    except (AttributeError, RuntimeError, TypeError) as exc:
        if not quiet:
            why = f"{type(exc).__name__}: {exc}"
            say(f"not restoring DDP's bucket layout ({why}); the resume may differ in the last bits")
        return False
    setattr(model, _CACHE, [list(b) for b in buckets])
    return True


@contextlib.contextmanager
def _assignment(buckets: list[list[int]], cap: int) -> Iterator[None]:
    """``dist._compute_bucket_assignment_by_size`` answers ``buckets`` while DDP builds its reducer.

    DDP reverses the assignment it gets (buckets of the last parameters go first), so the
    answer is reversed here to come out in ``buckets``' order.
    """
    original = dist._compute_bucket_assignment_by_size

    def fixed(*_args: Any, **_kwargs: Any) -> tuple[list[list[int]], list[int]]:
        return [list(b) for b in reversed(buckets)], [cap] * len(buckets)

    dist._compute_bucket_assignment_by_size = fixed
    try:
        yield
    finally:
        dist._compute_bucket_assignment_by_size = original
