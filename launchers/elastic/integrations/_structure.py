"""What staging loses of a state, put back: the materialised checkpoint is the one the framework would write.

Tensors that share a storage, a module state dict's ``_metadata``, a tensor's ``requires_grad`` (and
whether it was an ``nn.Parameter``), and which strings were one object.

Why the first: staging copies each tensor of a state on its own (``format.shardfile``), so two entries that were
one tensor — a language model's tied input and output embeddings (GPT-2's ``transformer.wte.weight`` and
``lm_head.weight``), any storage two parameters share — come back as two independent copies. The
frameworks' own writers decide on that sharing: Accelerate's ``save`` and transformers' ``save_pretrained``
drop every name but one of a shared storage before ``safetensors`` writes (and ``safetensors``'
``load_model`` then refuses a file that holds both: "Unexpected key(s) in state_dict"), ``torch.save``
writes a shared storage once. A checkpoint written from the staged copies without the sharing differs
from the framework's own, and may not load at all.

Why the second: ``Module.state_dict()`` is an ``OrderedDict`` carrying ``_metadata`` (each submodule's
state version, which ``load_state_dict`` hands to ``_load_from_state_dict``: how a module reads a state
saved by an older version of itself); ``torch.save`` writes it; staging keeps the mapping, not the attribute.

Why the others: ``torch.save`` writes them (``requires_grad`` and the ``Parameter`` type in each tensor's
record, a tensor's Python attributes — DeepSpeed ZeRO-3's ``ds_id`` on its flat partitions — beside it;
pickle writes a string once and refers back to it where the same object recurs). The names a
framework's code writes are interned literals, so equal strings were one object there: interning the copy's
strings writes the same bytes (a JSON-decoded "cpu" key otherwise made the Trainer's ``rng_state.pth`` differ).

So an integration stages ``record(state)`` beside the state (plain data: the paths of the entries that
share a storage, with each view's offset, shape, stride and dtype; each ``_metadata`` by the path of its
dict) and calls ``restore(state, recorded)`` on the copy it reads back before handing it to the framework's
writer: every group becomes views of one new storage again, holding the staged bytes, as it was shared,
each dict has its ``_metadata`` again, each tensor its ``requires_grad`` and plain Python attributes, and each
string is interned.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = ["record", "restore"]

Path = list[Any]  # keys (dicts) and indices (lists) from the state's root to a tensor


def record(state: Any) -> dict[str, Any]:
    """What ``restore`` needs to put back into a staged copy of ``state`` (plain data)."""
    grads = [[path, isinstance(t, torch.nn.Parameter)] for path, t in _tensors(state, []) if t.requires_grad]
    metadata = [[path, meta] for path, meta in _metadata(state, [])]
    attributes = [[path, attrs] for path, t in _tensors(state, []) if (attrs := _plain_attributes(t))]
    return {"shared": shared(state), "metadata": metadata, "grads": grads, "attributes": attributes}


def restore(state: Any, recorded: dict[str, Any] | None) -> Any:
    """Put ``record``'s findings back into ``state`` (the copy read back from staging); returns it."""
    if not recorded:
        return state
    retie(state, recorded.get("shared", []))
    for path, meta in recorded.get("metadata", []):
        target = _get(state, path)
        if isinstance(target, dict):
            target._metadata = OrderedDict(meta)  # type: ignore[attr-defined]  # as Module.state_dict makes it
    for path, parameter in recorded.get("grads", []):
        tensor = _get(state, path)
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            _put(state, path, torch.nn.Parameter(tensor) if parameter else tensor.requires_grad_(True))
    for path, attrs in recorded.get("attributes", []):
        tensor = _get(state, path)
        if isinstance(tensor, torch.Tensor):
            for name, value in attrs.items():
                setattr(tensor, sys.intern(name), value)
    return _intern(state)


_PLAIN = (str, int, float, bool, type(None))


def _plain_attributes(tensor: torch.Tensor) -> dict[str, Any]:
    """The Python attributes a tensor carries (its ``__dict__``, which ``torch.save`` writes) that are plain data:
    DeepSpeed ZeRO-3 tags its flat fp32 partitions with ``ds_id``."""
    attrs = getattr(tensor, "__dict__", None) or {}
    return {name: value for name, value in attrs.items() if isinstance(name, str) and isinstance(value, _PLAIN)}


def shared(state: Any) -> list[dict[str, Any]]:
    """The groups of tensors in ``state`` that share a storage (two or more entries each), as plain data.

    Only dicts and lists are walked (the containers ``retie`` can write back into); tensor subclasses
    other than ``nn.Parameter`` (a ``DTensor``) and tensors without storage are left out.
    """
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for path, tensor in _tensors(state, []):
        storage = tensor.untyped_storage()
        if storage.data_ptr() == 0:
            continue
        key = (tensor.device.type, tensor.device.index, storage.data_ptr())
        group = groups.setdefault(key, {"nbytes": storage.nbytes(), "members": []})
        group["members"].append(
            {
                "path": path,
                "offset": tensor.storage_offset(),
                "shape": list(tensor.shape),
                "stride": list(tensor.stride()),
                "dtype": str(tensor.dtype).removeprefix("torch."),
            }
        )
    return [g for g in groups.values() if len(g["members"]) > 1]


def retie(state: Any, groups: list[dict[str, Any]]) -> Any:
    """Make each group of ``shared`` views of one storage again, holding the values in ``state``; returns it.

    The new storage has the original's size; bytes no entry covers are zero. A path that no longer
    leads to a tensor of the recorded shape leaves its group as it is (said by the caller's own check).
    """
    for group in groups:
        members = group["members"]
        found = [_get(state, m["path"]) for m in members]
        pairs = zip(found, members, strict=True)
        if any(not isinstance(t, torch.Tensor) or list(t.shape) != m["shape"] for t, m in pairs):
            continue
        storage = torch.zeros(int(group["nbytes"]), dtype=torch.uint8).untyped_storage()
        for tensor, member in zip(found, members, strict=True):
            dtype = getattr(torch, member["dtype"])
            view = torch.empty(0, dtype=dtype).set_(storage, member["offset"], member["shape"], member["stride"])
            view.copy_(tensor)
            _put(state, member["path"], view)
    return state


def _metadata(obj: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    if isinstance(obj, Mapping):
        meta = getattr(obj, "_metadata", None)
        if isinstance(meta, dict):
            yield path, {key: dict(value) for key, value in meta.items()}
        for key, value in obj.items():
            yield from _metadata(value, [*path, key])
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _metadata(value, [*path, i])


def _intern(obj: Any) -> Any:
    """``obj`` with every string in its dicts (keys and values), lists and tuples interned (in place where
    the container allows: a dict keeps its type, order and attributes)."""
    if isinstance(obj, str):
        return sys.intern(obj) if type(obj) is str else obj
    if isinstance(obj, dict):
        items = [(_intern(key), _intern(value)) for key, value in obj.items()]
        obj.clear()
        obj.update(items)
    elif isinstance(obj, list):
        obj[:] = [_intern(value) for value in obj]
    elif type(obj) is tuple:
        return tuple(_intern(value) for value in obj)
    return obj


def _tensors(obj: Any, path: Path) -> Iterator[tuple[Path, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided:
            yield path, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _tensors(value, [*path, key])
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _tensors(value, [*path, i])


def _get(state: Any, path: Path) -> Any:
    for key in path:
        try:
            state = state[key]
        except (KeyError, IndexError, TypeError):
            return None
    return state


def _put(state: Any, path: Path, value: Any) -> None:
    parent = _get(state, path[:-1])
    parent[path[-1]] = value
