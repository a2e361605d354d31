"""How a message's fields become JSON and back, from the field's annotation: one generic codec, no per-kind code.

A ``Record`` is a frozen dataclass whose fields are named as they travel. Encoding writes
each field by its name (a nested record as its own dict, a tuple as a list; a field that is
None is left out and decodes as its default). Decoding converts each field by its annotation
(``int``, ``float``, ``bool``, ``str``, ``Any``, ``dict[str, Any]``, ``X | None``,
``tuple[X, ...]``, or another record's class name) and ignores fields it does not know; a
required field that is missing or does not convert raises KeyError, TypeError or ValueError.
The kinds and their fields are ``messages``'; this module names none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

M = TypeVar("M", bound="Record")
_RECORDS: dict[str, type[Record]] = {}  # class name → record class (a nested field's annotation names it)


class Record:
    """A value with named fields that travels on the wire (a message, or a part of one)."""

    __slots__ = ()

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict: each field by its name; a field that is None is left out (decoded as its default)."""
        wire: dict[str, Any] = {}
        for name in _names(type(self)):
            value = getattr(self, name)
            if value is not None:
                wire[name] = _encode(value)
        return wire

    @classmethod
    def from_wire(cls: type[M], wire: Mapping[str, Any]) -> M:
        return cls(**{name: decode(wire[name]) for name, decode in _decoders(cls) if name in wire})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RECORDS[cls.__name__] = cls


def field_names(cls: type) -> tuple[str, ...]:
    """The names ``cls`` puts on the wire."""
    return _names(cls)


_NAMES: dict[type, tuple[str, ...]] = {}
_DECODERS: dict[type, tuple[tuple[str, Callable[[Any], Any]], ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _encode(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_wire()
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _optional(decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else decode(value)


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"a mapping, not {type(value).__name__}")
    return value


_SCALARS: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": _text,
    "Any": lambda value: value,
    "dict[str, Any]": _mapping,
}


def _decoder(annotation: str) -> Callable[[Any], Any]:
    """How a field's wire value becomes its Python value, from the field's annotation."""
    if annotation.endswith(" | None"):
        return _optional(_decoder(annotation.removesuffix(" | None")))
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        item = _decoder(annotation[len("tuple[") : -len(", ...]")])
        return lambda value: tuple(item(v) for v in value)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    record = _RECORDS[annotation]
    return lambda value: record.from_wire(_mapping(value))


def _decoders(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    decoders = _DECODERS.get(cls)
    if decoders is None:
        decoders = _DECODERS[cls] = tuple((f.name, _decoder(str(f.type))) for f in dataclasses.fields(cls))
    return decoders
