"""The hub's exchanges: contributions in progress per topic, and the reduced results of finished ones.

A topic finishes when every member contributed (the membership is the hub's state: it can
change between generations, so no count is fixed here). Its result is kept for the last
``KEEP_DONE`` topics, so a node that says its contribution again (a rejoin) is answered
alone; the values themselves are dropped once reduced.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from launchers.control.reductions import ReductionError, reduce_values

KEEP_DONE = 256  # finished topics whose results the hub keeps for a repeated contribution
KEEP_OPEN = 1024  # unfinished topics at most (one a contributor abandoned stays until evicted)


@dataclass
class Done:
    shared: Any
    shares: dict[int, Any]
    error: str | None = None

    def message(self, topic: str, node: int) -> dict[str, Any]:
        if self.error is not None:
            return {"t": "got", "topic": topic, "error": self.error}
        return {"t": "got", "topic": topic, "value": self.shares.get(node, self.shared)}


@dataclass
class _Open:
    how: Any
    values: dict[int, Any] = field(default_factory=dict)
    error: str | None = None


class Gathers:
    def __init__(self) -> None:
        self.open: OrderedDict[str, _Open] = OrderedDict()
        self.done: OrderedDict[str, Done] = OrderedDict()

    def put(self, topic: str, node: int, how: Any, value: Any, members: Set[int]) -> Done | None:
        """Take ``node``'s contribution; the result once every member gave one (else None)."""
        gather = self.open.get(topic)
        if gather is None:
            gather = self.open[topic] = _Open(how)
            while len(self.open) > KEEP_OPEN:
                self.open.popitem(last=False)
        if how != gather.how:
            gather.error = f"the nodes disagree on how to reduce it ({gather.how!r}, node {node}: {how!r})"
        gather.values[node] = value
        return self.check(topic, members)

    def check(self, topic: str, members: Set[int]) -> Done | None:
        gather = self.open.get(topic)
        if gather is None or len(gather.values) < len(members) or not members <= gather.values.keys():
            return None  # the count first: the subset test is O(N), and a put comes from each of N nodes
        del self.open[topic]
        if gather.error is not None:
            done = Done(None, {}, gather.error)
        else:
            try:
                done = Done(*reduce_values(gather.how, {n: v for n, v in gather.values.items() if n in members}))
            except ReductionError as exc:
                done = Done(None, {}, str(exc))
        self.done[topic] = done
        while len(self.done) > KEEP_DONE:
            self.done.popitem(last=False)
        return done

    def partial(self, topic: str) -> dict[int, Any]:
        """The contributions so far of an unfinished topic (node 0's health check judges what arrived)."""
        gather = self.open.get(topic)
        return dict(gather.values) if gather is not None else {}
