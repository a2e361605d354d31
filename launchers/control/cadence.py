"""How often agents speak, scaled with the number of member nodes so the hub's load stays bounded.

Every agent message costs the hub one receive, one HMAC check and one JSON parse (about 20 µs
in Python); 4,096 agents at two heartbeats a second would be 8,192 messages a second, most
of a core. So the hub budgets ``AGENT_MESSAGES_PER_S`` messages a second in total and each
agent's interval grows with N once N passes what the budget allows at the fastest rate:

- ``heartbeat``: an agent that sent nothing else for this long says ``hb`` (any message is a
  sign of life, so a node that reports status never sends a plain heartbeat); the hub, too,
  says ``hb`` only when it broadcast nothing else for this long. Never more than a quarter of
  ``node_timeout``: four missed beats before a node is declared lost, whatever N (so past
  ~``AGENT_MESSAGES_PER_S`` × ``node_timeout`` / 4 nodes the timeout, not the budget, sets the
  rate: 65,536 nodes with the default 30 s send ~8,700 heartbeats a second; a longer
  ``node_timeout`` brings that down).
- ``status``: how often a node's status entry goes up to node 0 (the newest one only).
- ``hello_retry``: how long a node waits for ``welcome`` before saying ``hello`` again.

The hub computes the cadence from its membership and tells each agent in ``welcome``: when
the membership changes, the cadence follows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launchers.control.messages import Welcome

AGENT_MESSAGES_PER_S = 1000.0  # the hub's budget of agent messages per second, heartbeats or status
FASTEST_HEARTBEAT = 0.5  # seconds: the rate at small N
FASTEST_STATUS = 1.0  # seconds: what the observer publishes at
FASTEST_HELLO = 1.0
SLOWEST_HELLO = 10.0  # a join whose hello was lost waits this long at most to say it again
SUSPECT_AFTER_CLOSE = 1.5  # seconds of silence that judge a peer just after its connection closed


def after_close(node_timeout: float, heartbeat: float) -> float:
    """The silence that judges a peer whose TCP connection closed (its process likely ended): a few
    heartbeats, never more than ``node_timeout``. The hub uses it for members, an agent for the hub."""
    return min(node_timeout, max(SUSPECT_AFTER_CLOSE, 2 * heartbeat + 0.5))


@dataclass(frozen=True)
class Cadence:
    heartbeat: float
    status: float
    hello_retry: float

    @classmethod
    def of(cls, welcome: Welcome, fallback: Cadence) -> Cadence:
        """The intervals the hub said (one out of range keeps ``fallback``'s)."""

        def seconds(value: float, default: float) -> float:
            return float(value) if 0.05 <= value <= 3600 else default

        return cls(
            seconds(welcome.heartbeat, fallback.heartbeat),
            seconds(welcome.status_every, fallback.status),
            seconds(welcome.hello_retry, fallback.hello_retry),
        )


def cadence(members: int, node_timeout: float) -> Cadence:
    """The intervals for ``members`` agents: each at most a 1/N share of the hub's message budget."""
    share = max(1, members) / AGENT_MESSAGES_PER_S  # seconds between one agent's messages at full budget
    heartbeat = min(max(FASTEST_HEARTBEAT, share), max(0.05, node_timeout / 4))
    status = max(FASTEST_STATUS, share)
    return Cadence(heartbeat, status, min(SLOWEST_HELLO, max(FASTEST_HELLO, 2 * share)))
