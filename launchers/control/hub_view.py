"""What other threads see of node 0's hub: one immutable snapshot, published by the hub thread.

The hub thread owns every piece of the hub's state (the roster, the exchanges, the status
entries) and changes them as messages arrive. Node 0's main thread asks who waits to join,
what an unfinished exchange gathered, whether every node left, and the whole status view;
reading the hub's live dicts for that raced their changes ("dictionary changed size during
iteration", a view torn between two changes). Instead the hub publishes a ``HubView`` (one
attribute store, atomic in CPython) and readers only ever see a whole one.

When: before the hub says anything about a change of the roster (so a node told it was
admitted never finds node 0 still calling it a candidate), and otherwise at the end of each
pass of the hub's loop when something changed. Only the parts that changed are copied: the
roster's sets when a node changed status or was first heard, the topics whose contributions
changed, and the status entries at most every ``STATUS_EVERY`` seconds (they change with
every ``st``; copying thousands of them per message would be the hub's main cost) or with a
change of the roster (a node's last entry comes just before its ``bye``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from launchers.control.gathers import Gathers
from launchers.control.roster import NodeStatus, Roster

STATUS_EVERY = 0.2  # seconds between copies of the status entries (a status entry comes every ≥ 1 s)
_EMPTY: Mapping[Any, Any] = MappingProxyType({})


@dataclass(frozen=True)
class HubView:
    """The hub at one moment; never changed once published."""

    members: frozenset[int] = frozenset()  # what exchanges and meetings wait for
    waiting: tuple[int, ...] = ()  # candidates, in admission order
    ready: frozenset[int] = frozenset()  # the candidates that said ``ready`` (their ranks would start warm)
    said_bye: frozenset[int] = frozenset()
    left_out: frozenset[int] = frozenset()
    lost: frozenset[int] = frozenset()
    everyone_left: bool = True  # every other node that was heard said bye, was left out or is lost
    partial: Mapping[str, Mapping[int, Any]] = field(default_factory=lambda: _EMPTY)  # open exchanges' values
    status: Mapping[int, Any] = field(default_factory=lambda: _EMPTY)  # node → its newest status entry

    def gathered(self, topic: str) -> dict[int, Any]:
        """An unfinished exchange's values so far, and None for each node declared lost (none will come)."""
        return {**dict.fromkeys(self.lost), **self.partial.get(topic, _EMPTY)}


class Publisher:
    """Builds and publishes ``HubView``s for the hub thread; ``view`` and ``wait_everyone_left`` for the others."""

    def __init__(self) -> None:
        self.view = HubView()
        self._roster_version = (-1, -1)
        self._status_dirty = False
        self._status_at = -1e9
        self._everyone_left = threading.Event()
        self._everyone_left.set()

    def behind(self, roster: Roster) -> bool:
        """A node changed status or was first heard since the last view (published before anyone is told: a
        node welcomed must never find node 0's ``wait_everyone_left`` still answering from before its hello)."""
        return (roster.version, roster.heard_version) != self._roster_version

    def status_changed(self) -> None:
        self._status_dirty = True

    def publish(self, roster: Roster, gathers: Gathers, status: dict[int, Any], now: float, force: bool) -> None:
        """A new view if anything changed (``force``: the status entries too, however recent the last copy)."""
        view, changes = self.view, False
        if (roster.version, roster.heard_version) != self._roster_version:
            force = force or roster.version != self._roster_version[0]  # a node said bye: its last entry too
            self._roster_version = (roster.version, roster.heard_version)
            view, changes = _with_roster(view, roster), True
        if gathers.changed:
            partial = dict(view.partial)
            for topic in gathers.changed:
                values = gathers.partial(topic)
                if values is None:
                    partial.pop(topic, None)
                else:
                    partial[topic] = MappingProxyType(values)
            gathers.changed.clear()
            view, changes = replace(view, partial=MappingProxyType(partial)), True
        if self._status_dirty and (force or now - self._status_at >= STATUS_EVERY):
            self._status_dirty, self._status_at = False, now
            view, changes = replace(view, status=MappingProxyType(dict(status))), True
        if not changes:
            return
        self.view = view
        if view.everyone_left:
            self._everyone_left.set()
        else:
            self._everyone_left.clear()

    def wait_everyone_left(self, timeout: float) -> bool:
        return self._everyone_left.wait(timeout)


def _with_roster(view: HubView, roster: Roster) -> HubView:
    by: dict[NodeStatus, list[int]] = {status: [] for status in NodeStatus}
    for node, status in roster.status.items():
        by[status].append(node)
    return replace(
        view,
        members=roster.members,
        waiting=tuple(sorted(by[NodeStatus.CANDIDATE])),
        ready=frozenset(roster.ready),
        said_bye=frozenset(by[NodeStatus.SAID_BYE]),
        left_out=frozenset(by[NodeStatus.LEFT_OUT]),
        lost=frozenset(by[NodeStatus.LOST]),
        everyone_left=roster.everyone_left(),
    )
