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
- ``gather0``: the lowest contributor (node 0 while it is in the job) gets node → value, the
  others None;
- ``scatter0``: the lowest contributor's value is ``{"all": A, "each": {node: S}}``; node n gets
  ``{"all": A, "mine": S_n}`` (that node decided something for each node);
- ``group_rank``: the value is a group key; node n gets its position among its group's
  nodes, the group's size and the largest group's size.

- ``health.partners``: the health check's link pairing; its code is the health check's
  (``launchers.health.network.REDUCERS``), handed to the hub with the built-in ones.

The names are ``Reduction``'s. The hub reduces with the table it was given when it was built
(``BUILTIN``, plus what the caller adds: ``open_job_events(..., reducers=)``), so a name
resolves at node 0 because node 0's mlaunch said so, not because some module happened to be
imported there first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any

Result = tuple[Any, dict[int, Any]]
Reducer = Callable[[dict[int, Any]], Result]
Reducers = Mapping[str, Reducer]


class Reduction(str, Enum):
    """How an exchange is reduced (its name on the wire is the value)."""

    ALL = "all"
    COUNT = "count"
    INTERSECT = "intersect"
    MAX = "max"
    MIN = "min"
    AND = "and"
    GATHER0 = "gather0"
    SCATTER0 = "scatter0"
    GROUP_RANK = "group_rank"
    HEALTH_PARTNERS = "health.partners"  # launchers.health.network.REDUCERS

    def __str__(self) -> str:
        return self.value


How = Reduction | Mapping[str, Reduction]  # one reduction, or one per field of a dict value (a record)


class ReductionError(ValueError):
    """An unknown reduction, or values it cannot reduce; every contributor is told."""


def known(how: Any, reducers: Reducers) -> bool:
    if isinstance(how, str):
        return how in reducers
    return isinstance(how, dict) and bool(how) and all(isinstance(h, str) and h in reducers for h in how.values())


def reduce_values(how: Any, values: dict[int, Any], reducers: Reducers | None = None) -> Result:
    """``(shared, shares)`` of ``values`` (``how``: a ``How`` or its wire form); ReductionError if it does not fit."""
    reducers = BUILTIN if reducers is None else reducers
    if not known(how, reducers):
        raise ReductionError(f"unknown reduction {_plain(how)!r}")
    try:
        if isinstance(how, str):
            return reducers[how](values)
        return _record(how, values, reducers)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ReductionError(f"cannot reduce by {_plain(how)!r}: {type(exc).__name__}: {exc}") from None


def local(how: Any, node: int, value: Any, reducers: Reducers | None = None) -> Any:
    """``node``'s part of a reduction whose only contributor is ``node`` (one node, or a simulation)."""
    return result_for(node, *reduce_values(how, {node: value}, reducers))


def wire(how: How) -> Any:
    """``how`` as it travels (and as the hub compares it): the plain names."""
    return str(how) if isinstance(how, str) else {field: str(name) for field, name in how.items()}


def _plain(how: Any) -> Any:
    if isinstance(how, str):
        return str(how)
    return {field: str(name) for field, name in how.items()} if isinstance(how, Mapping) else how


def result_for(node: int, shared: Any, shares: Mapping[int, Any]) -> Any:
    return shares.get(node, shared)


def _record(how: dict[str, str], values: dict[int, Any], reducers: Reducers) -> Result:
    """Each field by its own reduction; node n gets {field: its result of the field}."""
    parts = {field: reducers[name]({n: v[field] for n, v in values.items()}) for field, name in how.items()}
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
    """To the lowest contributor: node 0, or the member that hosts the hub after it (``succession``)."""
    lead = min(values, default=0)
    return None, {lead: {str(n): v for n, v in sorted(values.items())}}


def _scatter0(values: dict[int, Any]) -> Result:
    decided = values.get(min(values, default=0)) or {}
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


BUILTIN: Reducers = MappingProxyType(
    {
        Reduction.ALL.value: _all,
        Reduction.COUNT.value: lambda values: (len(values), {}),
        Reduction.INTERSECT.value: _intersect,
        Reduction.MAX.value: lambda values: (max(values.values()), {}),
        Reduction.MIN.value: lambda values: (min(values.values()), {}),
        Reduction.AND.value: lambda values: (all(bool(v) for v in values.values()), {}),
        Reduction.GATHER0.value: _gather0,
        Reduction.SCATTER0.value: _scatter0,
        Reduction.GROUP_RANK.value: _group_rank,
    }
)  # health.partners is the health check's (``launchers.health.network.REDUCERS``)
