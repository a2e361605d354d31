"""Exact by default for DDP: every DDP model's gradient bucket layout travels with each staged or saved shard.

Why: a process that resumes builds a fresh ``DistributedDataParallel``, whose first step reduces with the
constructor's bucket layout, while the uninterrupted run's same step used the layout DDP rebuilt after its
first iteration; with more than two ranks gloo (and NCCL's ring) sum an element in an order that depends
on its offset in the bucket, so the resumed run ends in other last bits although it loaded the state bit
for bit (``tests/scripts/ddp_first_step.py`` shows it; ``ddp_buckets`` says how the layout is read and set).
Scripts stage ``model.module.state_dict()``, not the DDP wrapper, so the layout has to be found without them:

- ``header()`` (one line in ``Checkpointer._meta``: every shard staged or saved) returns the layout of each
  DDP model of this process, once DDP has rebuilt it, for the shard's JSON header. Read-only, never
  collective: a model whose rebuild is still pending (only its first step done) has none yet. The models
  are found by creation order: ``DistributedDataParallel.__init__`` is wrapped the first time this runs
  (earlier ones are found once through the garbage collector's list).
  A model between its first forward and that rebuild (a shard staged after the job's first step) is marked
  pending: its layout cannot be known without the collective the rebuild is, and the resume says so.
- ``recorded(shard)`` then ``resumed(...)`` (where ``load_latest`` settles on a checkpoint) read one header — the
  lowest saved rank's, the same file on every rank, so a grown job's new ranks set what the others set; the
  ranks compare what they read (``Recorded.digest``) before any sets it — and give each
  DDP model of this process — built before or after the load — its recorded layout in a forward pre-hook,
  so before its first step. The n-th DDP model built gets the n-th layout recorded (the same script builds
  its models in the same order); a model whose parameters do not match is left alone, said once.

Where a layout cannot be read or set (DDP's internals changed, the Python reducer), it says so once, and
the resumed run is only close (the last bits) to the uninterrupted one.

Importing this module imports no torch; it works only in a process that already imported DDP.
"""

from __future__ import annotations

import json
import sys
import threading
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_KEY = "ddp_buckets"  # in a shard's header: [{"index", "params", "buckets"}] per DDP model
_PENDING_KEY = "ddp_buckets_pending"  # creation indices of the DDP models whose rebuild was still pending
PENDING = (
    "resuming from step {step}, staged after its DDP model's first iteration: DDP had not yet rebuilt its "
    "gradient buckets, so the layout its next step reduced with is unknown here; the resumed run may differ from "
    "an uninterrupted one in the last bits (with more than two ranks)"
)
DISAGREE = (
    "the ranks read different DDP gradient bucket layouts from the checkpoint: none is set (each DDP keeps the "
    "constructor's), and the resumed run may differ from an uninterrupted one in the last bits"
)
_lock = threading.Lock()
_models: list[weakref.ReferenceType[Any]] = []  # every DDP model of this process, in creation order
_tracking = False
_pending: dict[int, dict[str, Any]] = {}  # creation index → the layout recorded for it
_said: set[str] = set()


def header() -> dict[str, Any]:
    """``{"ddp_buckets": [...]}`` for a shard's header; empty when this process has no DDP model."""
    ddp = _ddp_class()
    if ddp is None:
        return {}
    _track(ddp)
    from launchers.elastic import ddp_buckets

    entries, pending = [], []
    for index, ref in enumerate(list(_models)):
        model = ref()
        if model is None:
            continue
        buckets = ddp_buckets.rebuilt_layout(model)
        if buckets is None:
            if ddp_buckets.unreadable(model):
                _say_once("read", ddp_buckets.UNREADABLE)
            elif ddp_buckets.rebuild_pending(model):
                pending.append(index)
            continue
        entries.append({"index": index, "params": sum(len(b) for b in buckets), "buckets": buckets})
    return {**({_KEY: entries} if entries else {}), **({_PENDING_KEY: pending} if pending else {})}


@dataclass(frozen=True)
class Recorded:
    """The DDP layouts one shard's header recorded: what ``resumed`` sets, and what every rank must agree on."""

    entries: tuple[dict[str, Any], ...] = ()
    pending_at: int | None = None  # the step of a shard staged while a rebuild was pending

    def digest(self) -> int:
        """A number equal on two ranks exactly when they would set the same layouts (CRC-32 of the entries)."""
        return zlib.crc32(json.dumps(list(self.entries), sort_keys=True).encode())


def recorded(shard: Path, meta: dict[str, Any] | None = None) -> Recorded:
    """The layouts recorded in ``shard``'s header (the JSON header only), or in ``meta``, the shard's metadata when
    it was read from memory (a step still being committed has no file yet); empty when none or unreadable."""
    if _ddp_class() is None or (meta is None and not shard.is_file()):
        return Recorded()
    from launchers.elastic.format import shardfile

    try:
        meta = meta if meta is not None else shardfile.read_meta(shard)
    except (OSError, ValueError):
        return Recorded()
    pending = meta.get("step", -1) if meta.get(_PENDING_KEY) else None
    return Recorded(tuple(meta.get(_KEY) or ()), pending)


def resumed(layouts: Recorded, agreed: bool = True) -> None:
    """After ``load_latest`` chose a checkpoint: give each DDP model the layout ``layouts`` recorded for it.

    ``agreed`` False (the ranks read different layouts: ``resume`` compares ``digest()`` across them) sets
    none and says so: a reducer whose buckets order the parameters unlike its peers' sums one parameter's
    gradient into another's, silently (a grown job's new ranks once read no layout while the others did).
    """
    ddp = _ddp_class()
    if ddp is None:
        return
    if layouts.pending_at is not None:
        _say_once("pending", PENDING.format(step=layouts.pending_at))
    if not agreed:
        _say_once("disagree", DISAGREE)
        return
    _track(ddp)
    with _lock:
        _pending.clear()
        _pending.update({int(e["index"]): e for e in layouts.entries})
        models = list(enumerate(_models))
    for index, ref in models:
        model = ref()
        if model is not None and index in _pending:
            _arm(model, index)


def forget_models() -> None:
    """A recovering process calls its training function again (``elastic.recoverable``): the models the failed
    call built are gone, and the next call's are numbered from 0 again, as in a fresh process."""
    with _lock:
        _models.clear()
        _pending.clear()


def _ddp_class() -> Any:
    module = sys.modules.get("torch.nn.parallel.distributed")
    return getattr(module, "DistributedDataParallel", None) if module is not None else None


def _track(ddp: Any) -> None:
    """Register every DDP model: those alive now (once), and each one built from now on."""
    global _tracking
    with _lock:
        if _tracking:
            return
        _tracking = True
        import gc

        for obj in gc.get_objects():
            if isinstance(obj, ddp):
                _models.append(weakref.ref(obj))
        original = ddp.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            with _lock:
                _models.append(weakref.ref(self))
                index = len(_models) - 1
                armed = index in _pending
            if armed:
                _arm(self, index)

        init.__wrapped__ = original  # type: ignore[attr-defined]
        ddp.__init__ = init


def _arm(model: Any, index: int) -> None:
    """Set the recorded layout on ``model`` right before its next forward (its first step after the resume)."""
    if getattr(model, "_mlaunch_layout_hook", None) is not None:
        return

    def before_forward(module: Any, _args: Any) -> None:
        handle = module._mlaunch_layout_hook
        module._mlaunch_layout_hook = None
        handle.remove()
        with _lock:
            entry = _pending.pop(index, None)
        if entry is None:
            return
        from launchers.elastic import ddp_buckets

        if ddp_buckets.current_layout(module) == entry["buckets"]:
            return  # already set (restore() of capture's state, an integration)
        if not ddp_buckets.set_layout(module, entry["buckets"], quiet=True):
            _say_once("set", ddp_buckets.UNSETTABLE)

    model._mlaunch_layout_hook = model.register_forward_pre_hook(before_forward)


def _say_once(key: str, message: str) -> None:
    if key in _said:
        return
    _said.add(key)
    from launchers.elastic.ranks.collective import say

    say(message)
