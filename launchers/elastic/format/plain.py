"""A state's skeleton as plain JSON: what a shard header holds, and nothing that can run code on load.

``to_json`` turns the user's nested containers into JSON values: ``None``, bools, ints,
strings and finite floats as they are; dicts with string keys as JSON objects; lists as
arrays. Everything else that is still plain data is a *tagged* object, ``{"$tag": value}``:

=============  ===========================================  ==============================
tag            value                                        for
=============  ===========================================  ==============================
``$ref``       blob index (``"type"``: what was pickled)    tensors, arrays, trusted objects
``$tuple``     list                                         tuples (RNG states...)
``$dict``      ``[[key, value], ...]``                      dicts with other keys (optimizer state)
``$odict``     ``[[key, value], ...]``                      ``OrderedDict`` (module state dicts)
``$float``     ``"nan"``, ``"inf"``, ``"-inf"``             non-finite floats
``$bytes``     hex string                                   bytes
``$complex``   ``[real, imag]``                             complex numbers
``$np``        ``[dtype, hex of the bytes]``                NumPy scalars (``np.float32(1.5)``)
``$torch``     ``["dtype"|"device"|"size", value]``         ``torch.dtype``, ``torch.device``, ``torch.Size``
=============  ===========================================  ==============================

Any other object is refused (``UnsafeState``) unless the caller trusts the checkpoint: then
``leaf`` stores it as a pickled blob, which ``from_json`` hands back to a *trusted* reader only.
Reading parses JSON and builds only the types above: it never imports or calls anything a
file names.
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Leaf = Callable[[Any, str], Any]  # (object, where) -> its JSON value (a ``$ref``), or raise

_PLAIN = (bool, int, str, type(None))


class UnsafeState(TypeError):
    """A value that is not plain data in a state saved without ``trusted=True``."""


def to_json(obj: Any, leaf: Leaf, where: str = "state") -> Any:
    """The JSON value of ``obj``; ``leaf`` handles what is not a container or a plain scalar."""
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if kind is float:
        return obj if math.isfinite(obj) else {"$float": repr(obj)}
    if kind is list:
        return [to_json(v, leaf, f"{where}[{i}]") for i, v in enumerate(obj)]
    if kind is tuple:
        return {"$tuple": [to_json(v, leaf, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if kind is dict and all(type(k) is str and not k.startswith("$") for k in obj):
        return {k: to_json(v, leaf, f"{where}[{k!r}]") for k, v in obj.items()}
    if kind is dict or kind is OrderedDict:
        items = [[to_json(k, leaf, f"{where}.keys()"), to_json(v, leaf, f"{where}[{k!r}]")] for k, v in obj.items()]
        return {"$odict" if kind is OrderedDict else "$dict": items}
    if kind is bytes:
        return {"$bytes": obj.hex()}
    if kind is complex:
        return {"$complex": [to_json(obj.real, leaf), to_json(obj.imag, leaf)]}
    tagged = _framework_scalar(obj)
    return tagged if tagged is not None else leaf(obj, where)


def _framework_scalar(obj: Any) -> dict[str, Any] | None:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.generic) and not obj.dtype.hasobject:
        return {"$np": [obj.dtype.str, obj.tobytes().hex()]}
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.dtype):
            return {"$torch": ["dtype", str(obj).removeprefix("torch.")]}
        if type(obj) is torch.device:
            return {"$torch": ["device", str(obj)]}
        if type(obj) is torch.Size:
            return {"$torch": ["size", list(obj)]}
    return None


def refuse(obj: Any, where: str) -> Any:
    """The ``leaf`` of an untrusted save: anything but plain data is an error that says what to do."""
    raise UnsafeState(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}: a checkpoint holds only plain data "
        "(numbers, strings, bools, None, lists, tuples, dicts, tensors, arrays, RNG states) unless the "
        "Checkpointer is created with trusted=True (then any picklable object is saved, and loading it "
        "runs its unpickling code, so only checkpoints you wrote can be loaded)"
    )


def from_json(value: Any, ref: Callable[[dict[str, Any]], Any]) -> Any:
    """Rebuild what ``to_json`` made; ``ref`` resolves a ``$ref`` object (a blob)."""
    if type(value) is list:
        return [from_json(v, ref) for v in value]
    if type(value) is not dict:
        return value
    if any(k.startswith("$") for k in value):  # plain dicts never have such keys (see ``to_json``)
        return _tagged(value, ref)
    return {k: from_json(v, ref) for k, v in value.items()}


def _tagged(value: dict[str, Any], ref: Callable[[dict[str, Any]], Any]) -> Any:
    tag = next(k for k in value if k.startswith("$"))
    body = value[tag]
    if tag == "$ref":
        return ref(value)
    if tag == "$tuple":
        return tuple(from_json(v, ref) for v in body)
    if tag in ("$dict", "$odict"):
        pairs = ((_key(from_json(k, ref)), from_json(v, ref)) for k, v in body)
        return OrderedDict(pairs) if tag == "$odict" else dict(pairs)
    if tag == "$float":
        return float({"nan": "nan", "inf": "inf", "-inf": "-inf"}[body])
    if tag == "$bytes":
        return bytes.fromhex(body)
    if tag == "$complex":
        return complex(float(from_json(body[0], ref)), float(from_json(body[1], ref)))
    if tag == "$np":
        import numpy as np

        dtype = np.dtype(str(body[0]))
        if dtype.hasobject:
            raise ValueError(f"object dtype in a NumPy scalar: {body[0]!r}")
        return np.frombuffer(bytes.fromhex(body[1]), dtype=dtype)[0]
    if tag == "$torch":
        return _torch_value(str(body[0]), body[1])
    raise ValueError(f"unknown tag {tag!r} in a checkpoint header")


def _key(key: Any) -> Any:
    if isinstance(key, list):
        raise ValueError("a list cannot be a dict key")
    return key


def _torch_value(kind: str, body: Any) -> Any:
    import torch

    if kind == "dtype":
        dtype = getattr(torch, str(body), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a torch dtype: {body!r}")
        return dtype
    if kind == "device":
        return torch.device(str(body))
    if kind == "size":
        return torch.Size([int(v) for v in body])
    raise ValueError(f"unknown torch value {kind!r} in a checkpoint header")
