"""One agent's part of the job's status view: its own entry going up, and what node 0 sends down.

Status goes up only: the node's newest entry leaves at most once per status interval (a newer
one replaces an unsent one), and node 0 keeps every node's. What comes down is node 0's
summary of the job, and the whole view once when ``mlaunch status`` on this node asked for it
(at most once a second); that view is this node's for ``VIEW_FRESH`` seconds, then it is stale
and only the node's own entry is shown again.

A part of ``agent_core.AgentState``: every method runs under the state's lock.
"""

from __future__ import annotations

from typing import Any

VIEW_FRESH = 1.5  # seconds a whole view asked of node 0 stays in this node's status view (then it is stale)
ASK_EVERY = 1.0  # a watching `mlaunch status` asks every second at most


class StatusMirror:
    def __init__(self, node: int) -> None:
        self.node = node
        self.summary: dict[str, Any] = {}  # node 0's newest summary of the job
        self.view: dict[int, dict[str, Any]] = {}  # node → status entry: this node's, and node 0's answer
        self.view_at = 0.0  # when node 0's answer came (monotonic)
        self._entry: dict[str, Any] | None = None  # the newest entry not sent yet
        self._sent = -1e9
        self._asked = -1e9

    def publish(self, entry: dict[str, Any]) -> None:
        self._entry = entry
        self.view[self.node] = entry

    def flush(self) -> None:
        """The newest entry leaves at the next chance, however recent the last one (leaving)."""
        self._sent = -1e9

    def due(self, now: float, every: float) -> dict[str, Any] | None:
        """The entry to send now, if one is waiting and the interval passed."""
        entry = self._entry
        if entry is None or now - self._sent < every:
            return None
        self._sent, self._entry = now, None
        return entry

    def ask(self, now: float) -> bool:
        """Whether to ask node 0 for the whole view now."""
        if now - self._asked < ASK_EVERY:
            return False
        self._asked = now
        return True

    def answered(self, nodes: dict[str, Any], now: float) -> None:
        """Node 0's whole view (``view``): every other node's entry, this node's own kept."""
        for node, entry in nodes.items():
            if str(node).isascii() and str(node).isdigit() and int(node) != self.node:
                self.view[int(node)] = entry
        self.view_at = now

    def seen(self, now: float) -> dict[int, dict[str, Any]]:
        """This node's entry, and every node's while an asked-for view is fresh."""
        if now - self.view_at > VIEW_FRESH:
            return {n: e for n, e in self.view.items() if n == self.node}
        return dict(self.view)
