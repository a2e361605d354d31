"""The hub's exchanges: contributions in progress per topic, and the reduced results of finished ones.

A topic finishes when every member contributed (the membership is the hub's state: it can
change between generations, so no count is fixed here). Its result is kept for the last
``KEEP_DONE`` topics, so a node that says its contribution again (a rejoin) is answered
alone; the values themselves are dropped once reduced.

Owned by the hub thread. ``changed`` names the topics whose contributions changed since the
hub last published its view (``HubView.partial``): it copies only those.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from launchers.control.messages import Got
from launchers.control.reductions import Reducers, ReductionError, reduce_values

KEEP_DONE = 256  # finished topics whose results the hub keeps for a repeated contribution
KEEP_OPEN = 1024  # unfinished topics at most (one a contributor abandoned stays until evicted)


@dataclass
class Done:
    shared: Any
    shares: dict[int, Any]
    error: str | None = None

    def message(self, topic: str, node: int) -> Got:
        if self.error is not None:
            return Got(topic, error=self.error)
        return Got(topic, self.shares.get(node, self.shared))


@dataclass
class _Open:
    how: Any
    values: dict[int, Any] = field(default_factory=dict)
    error: str | None = None


class Gathers:
    def __init__(self, reducers: Reducers) -> None:
        self.reducers = reducers
        self.open: OrderedDict[str, _Open] = OrderedDict()
        self.done: OrderedDict[str, Done] = OrderedDict()
        self.changed: set[str] = set()

    def put(self, topic: str, node: int, how: Any, value: Any, members: Set[int]) -> Done | None:
        """Take ``node``'s contribution; the result once every member gave one (else None)."""
        gather = self.open.get(topic)
        if gather is None:
            gather = self.open[topic] = _Open(how)
            while len(self.open) > KEEP_OPEN:
                self.changed.add(self.open.popitem(last=False)[0])
        if how != gather.how:
            gather.error = f"the nodes disagree on how to reduce it ({gather.how!r}, node {node}: {how!r})"
        gather.values[node] = value
        self.changed.add(topic)
        return self.check(topic, members)

    def check(self, topic: str, members: Set[int]) -> Done | None:
        gather = self.open.get(topic)
        if gather is None or len(gather.values) < len(members) or not members <= gather.values.keys():
            return None  # the count first: the subset test is O(N), and a put comes from each of N nodes
        del self.open[topic]
        if gather.error is not None:
            done = Done(None, {}, gather.error)
        else:
            values = {n: v for n, v in gather.values.items() if n in members}
            try:
                done = Done(*reduce_values(gather.how, values, self.reducers))
            except ReductionError as exc:
                done = Done(None, {}, str(exc))
        self._finish(topic, done)
        return done

    def void(self, error: str) -> list[tuple[str, list[int]]]:
        """End every exchange in flight with ``error``: (topic, its contributors so far) of each."""
        opened = [(topic, list(gather.values)) for topic, gather in self.open.items()]
        self.open.clear()
        for topic, _ in opened:
            self._finish(topic, Done(None, {}, error))
        return opened

    def partial(self, topic: str) -> dict[int, Any] | None:
        """The contributions so far of an unfinished topic (None: not open)."""
        gather = self.open.get(topic)
        return dict(gather.values) if gather is not None else None

    def _finish(self, topic: str, done: Done) -> None:
        self.changed.add(topic)
        self.done[topic] = done
        while len(self.done) > KEEP_DONE:
            self.done.popitem(last=False)
