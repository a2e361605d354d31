"""Parse human durations (``30s``, ``5m``, ``1h30m``, ``500ms``, bare numbers = seconds).

Grace periods and backoffs appear in job.yaml and in Kubernetes manifests; a single parser
keeps "30s" meaning the same thing everywhere.
"""

from __future__ import annotations

import math
import re

from launchers.config.limits import MAX_DURATION

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")

# What ``parse_duration`` accepts, as a JSON Schema (ECMA-262) pattern for editors: a bare
# number of seconds, or number+unit parts, any case, spaces around the parts. Anchored at
# both ends: JSON Schema's ``pattern`` matches anywhere in the string.
_NUMBER = r"[0-9]+(\.[0-9]+)?"
_UNIT = r"([mM][sS]|[sSmMhHdD])"
DURATION_PATTERN = rf"^\s*({_NUMBER}|( *{_NUMBER} *{_UNIT} *)+)\s*$"


def parse_duration(value: object) -> float:
    """Return seconds for ``value`` (finite, 0 ≤ seconds ≤ one year); ValueError with the accepted forms otherwise."""
    return _in_range(_seconds(value))


def _in_range(seconds: float) -> float:
    if not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number of seconds (not .nan or .inf)")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > MAX_DURATION:
        raise ValueError(f"a duration must be at most {MAX_DURATION:g} seconds (365d)")
    return seconds


def _seconds(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m, 1h or a number of seconds")
    if isinstance(value, (int, float)):
        if isinstance(value, int) and abs(value) > 10**18:
            raise ValueError(f"a duration must be at most {MAX_DURATION:g} seconds (365d)")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("expected a duration such as 30s, 5m, 1h or a number of seconds")
    text = value.strip().lower().replace(" ", "")
    if len(text) > 64:
        raise ValueError(f"{value[:40]!r}... is too long for a duration; use forms like 30s, 5m, 1h30m")
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return float(text)
    pos = 0
    total = 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{value!r} is not a duration; use forms like 30s, 90s, 5m, 1h30m, 500ms or seconds")
    return total


def format_duration(seconds: float) -> str:
    """Short, exact form used in messages and generated files (``30s``, ``1.5s``)."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{seconds:g}s"
