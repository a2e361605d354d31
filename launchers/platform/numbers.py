"""The one door for numbers and JSON the platform gives: env variables, arguments, rank tables, TF_CONFIG.

- ``parse_int``: ASCII digits only (``str.isdigit()`` takes "²" and "٣", ``int()`` takes
  "٣" and "1_0"), at most 9 of them, range-checked; the message names the variable.
- ``env_int``: ``parse_int`` on one env variable. Unset is ``None``; set but empty is an error
  (no platform documents an empty count or rank), unless the caller says empty means unset.
- ``parse_json``: size- and depth-bounded JSON with the position of a syntax error, never a
  ``RecursionError`` or ``ValueError`` from a huge number.

Stdlib only: cheap to import on the run path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from itertools import chain
from typing import Any

from launchers.config.limits import MAX_JSON_BYTES, MAX_JSON_DEPTH
from launchers.errors import PlatformError

_DIGITS = re.compile(r"[0-9]{1,9}")
MAX_PLATFORM_INT = 999_999_999


def parse_int(
    raw: str,
    what: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_PLATFORM_INT,
    meaning: str = "",
    error: type[PlatformError] = PlatformError,
) -> int:
    """``raw`` as an int in ``minimum..maximum``; otherwise ``error`` naming ``what`` (e.g. ``platform env RANK``)."""
    text = raw.strip(" \t")
    expected = meaning or "a whole number"
    if not _DIGITS.fullmatch(text):
        sign = text.startswith("-") and _DIGITS.fullmatch(text[1:])
        if sign:
            raise error(f"{what}={raw!r} must be ≥ {minimum} ({expected})")
        raise error(f"{what}={raw!r} is not an integer; expected {expected} (digits 0-9)")
    value = int(text)
    if value < minimum:
        raise error(f"{what}={raw!r} must be ≥ {minimum} ({expected})")
    if value > maximum:
        raise error(f"{what}={raw!r} must be ≤ {maximum} ({expected})")
    return value


def env_int(
    env: Mapping[str, str],
    name: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_PLATFORM_INT,
    meaning: str = "",
    empty_is_unset: bool = False,
) -> int | None:
    """Integer env var or None when unset; malformed, empty or out of range → PlatformError naming it."""
    raw = env.get(name)
    if raw is None:
        return None
    if not raw.strip():
        if empty_is_unset:
            return None
        raise PlatformError(f"platform env {name} is set but empty; expected {meaning or 'a whole number'}")
    return parse_int(raw, f"platform env {name}", minimum=minimum, maximum=maximum, meaning=meaning)


def _depth_ok(value: Any) -> bool:
    """Whether parsed JSON nests at most ``MAX_JSON_DEPTH`` deep, walked level by level without recursion.

    Checked on the parsed value (json's decoder guards its own recursion). Each level's
    children are gathered and typed by C loops (``chain``, ``map``), so a level of scalars —
    the million values of a 16,384-server rank table's devices — costs no Python step per
    value; only a level that mixes containers and scalars is filtered value by value.
    """
    dicts, lists = ([value], []) if type(value) is dict else ([], [value] if type(value) is list else [])
    depth = 1
    while dicts or lists:
        children = [*chain.from_iterable(map(dict.values, dicts)), *chain.from_iterable(lists)]
        kinds = set(map(type, children))
        if dict not in kinds and list not in kinds:
            return True
        if depth >= MAX_JSON_DEPTH:
            return False
        if kinds == {dict}:
            dicts, lists = children, []
        elif kinds == {list}:
            dicts, lists = [], children
        else:
            dicts = [child for child in children if type(child) is dict]
            lists = [child for child in children if type(child) is list]
        depth += 1
    return True


_HUGE_NUMBER = re.compile(r'(?:"((?:[^"\\]|\\.){0,64})"\s*:\s*)?(-?[0-9]{1000,})')


def _huge_number(text: str) -> str | None:
    """Where the over-long number is, and under which key: instead of Python's int-conversion message."""
    found = _HUGE_NUMBER.search(text)
    if found is None:
        return None
    start = found.start(2)
    line = text.count("\n", 0, start) + 1
    column = start - (text.rfind("\n", 0, start) + 1) + 1
    field = f"field {found.group(1)!r} " if found.group(1) is not None else "a value "
    digits = len(found.group(2).lstrip("-"))
    return (
        f"has {field}(line {line}, column {column}) that is a number of {digits} digits; "
        "no count, index, id or port is that long"
    )


def parse_json(text: str, what: str, *, error: type[PlatformError] = PlatformError) -> Any:
    """JSON from the platform (TF_CONFIG, a rank table); ``error`` naming ``what`` and the position otherwise."""
    if len(text) > MAX_JSON_BYTES:
        raise error(f"{what} is larger than {MAX_JSON_BYTES:,} characters")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}, char {exc.pos}: {exc.msg})"
        ) from None
    except RecursionError:
        raise error(f"{what} nests more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:  # a number of 5,000 digits: Python's int-conversion limit
        raise error(f"{what} {_huge_number(text) or f'has a value JSON cannot hold ({exc})'}") from None
    if isinstance(value, (dict, list)) and not _depth_ok(value):
        raise error(f"{what} nests more than {MAX_JSON_DEPTH} levels deep")
    return value
