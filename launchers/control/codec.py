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
        _encoder(type(self))(self, wire)
        return wire

    @classmethod
    def from_wire(cls: type[M], wire: Mapping[str, Any]) -> M:
        decoded: M = _decoder_of(cls)(wire)
        return decoded

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _RECORDS[cls.__name__] = cls


def field_names(cls: type) -> tuple[str, ...]:
    """The names ``cls`` puts on the wire."""
    return tuple(f.name for f in dataclasses.fields(cls))


def decoder(cls: type[M]) -> Callable[[Mapping[str, Any]], M]:
    """``cls.from_wire`` without the lookups (the hub and every agent decode each message they receive)."""
    return _decoder_of(cls)


def encode_into(record: Record, wire: dict[str, Any]) -> None:
    """``record``'s fields into ``wire`` (a message's kind is already there)."""
    _encoder(type(record))(record, wire)


# -- per class, compiled once: every agent decodes every broadcast, so a generic loop would cost --------
_ENCODERS: dict[type, Callable[[Any, dict[str, Any]], None]] = {}
_DECODERS: dict[type, Callable[[Mapping[str, Any]], Any]] = {}
_PLAIN = ("int", "float", "bool", "str")  # never None, never nested: copied as they are


def _encoder(cls: type) -> Callable[[Any, dict[str, Any]], None]:
    encoder = _ENCODERS.get(cls)
    if encoder is None:
        lines = ["def encode(self, w):"]
        for f in dataclasses.fields(cls):
            if str(f.type) in _PLAIN:
                lines.append(f"    w[{f.name!r}] = self.{f.name}")
            else:
                lines += [f"    v = self.{f.name}", "    if v is not None:", f"        w[{f.name!r}] = _encode(v)"]
        lines += [] if len(lines) > 1 else ["    pass"]
        encoder = _ENCODERS[cls] = _compile(lines, {"_encode": _encode})["encode"]
    return encoder


def _decoder_of(cls: type) -> Callable[[Mapping[str, Any]], Any]:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        scope: dict[str, Any] = {"cls": cls}
        args = []
        for index, f in enumerate(dataclasses.fields(cls)):
            annotation, get = str(f.type), f"w[{f.name!r}]"
            if annotation == "Any":
                value = get
            elif annotation in _PLAIN:  # the builtin itself, inline
                value = f"{annotation}({get})"
            else:
                value, scope[f"c{index}"] = f"c{index}({get})", _decoder(annotation)
            if f.default is not dataclasses.MISSING:
                scope[f"d{index}"] = f.default
                value = f"({value} if {f.name!r} in w else d{index})"
            args.append(value)
        decoder = _DECODERS[cls] = _compile(["def decode(w):", f"    return cls({', '.join(args)})"], scope)["decode"]
    return decoder


def _compile(lines: list[str], scope: dict[str, Any]) -> dict[str, Any]:
    exec("\n".join(lines), scope)  # noqa: S102 - source built above from the dataclass's own field names
    return scope


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
