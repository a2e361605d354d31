"""What the hub counts: messages it did not act on, the traffic over its socket, what strangers cost it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Dropped:
    """Messages the hub did not act on, by why (``mlaunch status`` shows them with ``transport.Strangers``)."""

    unverified: int = 0  # no valid MAC: garbage, a forgery, another job's key
    malformed: int = 0  # sealed with the job's key, but not a message the hub knows
    ungreeted: int = 0  # a first start's hub: from a connection that never said hello (a hub elsewhere's member)


@dataclass
class Traffic:
    """What crossed the hub's socket (the benchmark's bytes per second)."""

    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    slowest_broadcast: float = 0.0  # seconds the longest broadcast took to hand to every peer's queue
    broadcasts: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind → (began, seconds) of the last


def wire_stats(encrypted: bool, dropped: Dropped, strangers: Any, replayed: int = 0) -> dict[str, Any]:
    """The status line's figures: what the hub refused, and the connections that never authenticated."""
    return {
        "encrypted": encrypted,
        "unverified": dropped.unverified,
        "malformed": dropped.malformed,
        "ungreeted": dropped.ungreeted,
        "replayed": replayed,
        "handshake_failed": strangers.handshake_failed,
        "closed_unauthenticated": strangers.closed_unauthenticated,
        "over_cap": strangers.over_cap,
        "cap": strangers.cap,
        "pending": strangers.pending(),
    }
