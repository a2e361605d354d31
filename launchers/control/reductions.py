"""Reductions the hub applies to an exchange: every member contributes a value, each gets what it needs.

A reduction maps the members' values (node → value) to ``(shared, shares)``: node ``n``
receives ``shares[n]`` when there is one, else ``shared``. An aggregate every node needs
(the restart meeting's count, the newest step every node staged) is ``shared``: one message,
encoded and signed once for every node, O(1) bytes per agent. Values only node 0 needs
(the flash save's shard sizes, the health results) go to node 0 alone (``gather0``); values
nodes need of each other (a health link partner) go as each node's own ``shares``.

``how`` names a reduction, or maps the fields of a dict value to reductions (a record:
each node receives a dict of the fields' results). The built-in names:

- ``all``: every value to every node (node → value); O(N) bytes per agent: small jobs only;
- ``count``: how many members contributed (a meeting);
- ``intersect``: the sorted common elements of every node's list;
- ``max`` / ``min``: of numbers; ``and``: every value true;
- ``gather0``: node 0 gets node → value, the others None;
- ``scatter0``: node 0's value is ``{"all": A, "each": {node: S}}``; node n gets
  ``{"all": A, "mine": S_n}`` (node 0 decided something for each node);
- ``group_rank``: the value is a group key; node n gets its position among its group's
  nodes, the group's size and the largest group's size.

``register`` adds a named reduction (the health check's link pairing): node 0's mlaunch,
which hosts the hub, runs the same code as every node, so the name resolves there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Result = tuple[Any, dict[int, Any]]
Reducer = Callable[[dict[int, Any]], Result]

_REDUCERS: dict[str, Reducer] = {}


class ReductionError(ValueError):
    """An unknown reduction, or values it cannot reduce; every contributor is told."""


def register(name: str, reducer: Reducer) -> None:
    _REDUCERS[name] = reducer


def known(how: Any) -> bool:
    if isinstance(how, str):
        return how in _REDUCERS
    return isinstance(how, dict) and bool(how) and all(isinstance(h, str) and h in _REDUCERS for h in how.values())


def reduce_values(how: Any, values: dict[int, Any]) -> Result:
    """``(shared, shares)`` of ``values``; ReductionError when ``how`` or a value does not fit."""
    if not known(how):
        raise ReductionError(f"unknown reduction {how!r}")
    try:
        if isinstance(how, str):
            return _REDUCERS[how](values)
        return _record(how, values)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ReductionError(f"cannot reduce by {how!r}: {type(exc).__name__}: {exc}") from None


def result_for(node: int, shared: Any, shares: Mapping[int, Any]) -> Any:
    return shares.get(node, shared)


def _record(how: dict[str, str], values: dict[int, Any]) -> Result:
    """Each field by its own reduction; node n gets {field: its result of the field}."""
    parts = {field: _REDUCERS[name]({n: v[field] for n, v in values.items()}) for field, name in how.items()}
    shared = {field: part[0] for field, part in parts.items()}
    nodes = {n for _, shares in parts.values() for n in shares}
    shares = {n: {field: result_for(n, *parts[field]) for field in how} for n in nodes}
    return shared, shares


def _all(values: dict[int, Any]) -> Result:
    return {str(n): v for n, v in sorted(values.items())}, {}


def _intersect(values: dict[int, Any]) -> Result:
    sets = [set(v) for v in values.values()]
    return sorted(set.intersection(*sets)) if sets else [], {}


def _gather0(values: dict[int, Any]) -> Result:
    return None, {0: {str(n): v for n, v in sorted(values.items())}}


def _scatter0(values: dict[int, Any]) -> Result:
    decided = values.get(0) or {}
    each = decided.get("each") or {}
    everyone = decided.get("all")
    return {"all": everyone, "mine": None}, {int(n): {"all": everyone, "mine": s} for n, s in each.items()}


def _group_rank(values: dict[int, Any]) -> Result:
    groups: dict[str, list[int]] = {}
    for n in sorted(values):
        groups.setdefault(str(values[n]), []).append(n)
    most = max((len(g) for g in groups.values()), default=1)
    shares = {n: {"index": i, "size": len(g), "most": most} for g in groups.values() for i, n in enumerate(g)}
    return {"index": 0, "size": 1, "most": most}, shares


register("all", _all)
register("count", lambda values: (len(values), {}))
register("intersect", _intersect)
register("max", lambda values: (max(values.values()), {}))
register("min", lambda values: (min(values.values()), {}))
register("and", lambda values: (all(bool(v) for v in values.values()), {}))
register("gather0", _gather0)
register("scatter0", _scatter0)
register("group_rank", _group_rank)
