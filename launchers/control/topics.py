"""The names of exchanges and meetings, one constructor per feature, so two features can never share a name.

A topic names one exchange job-wide: every node contributes under the same name and the hub
keeps the last ``gathers.KEEP_DONE`` results by it (a node that says its part again is answered
from there), so a name is used once. The first part says whose it is (errors quote it); the
rest makes it unique: an attempt, a flash save's key, a background round, a health check's
generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launchers.control.reductions import How

Exchange = Callable[[str, Any, float, How], Any]
"""``(topic, value, deadline, how)`` → this node's part of the reduction (``JobEvents.reduce``; ExchangeFailed)."""


def feature(topic: str) -> str:
    """Whose exchange ``topic`` is (what an error names)."""
    return topic.split("/")[0]


# -- restarts ---------------------------------------------------------------------------------------
def restart(attempt: int) -> str:
    """Every node ready to start ``attempt`` (a fixed membership's meeting: ``count``)."""
    return f"start/{attempt}"


def meeting(generation: int) -> str:
    """An elastic job's members meeting before ``generation`` (``meet``/``met``)."""
    return str(generation)


def meeting_after_health(key: str) -> str:
    """The meeting again after the health check before it left nodes out (no one is admitted there)."""
    return f"{key}/health"


# -- the flash save -----------------------------------------------------------------------------------
def flash_candidates(key: str) -> str:
    """The steps every node staged (``intersect``)."""
    return f"cand/{key}"


def flash_done(key: str) -> str:
    """Each node's written shard sizes for node 0's commit (``gather0``)."""
    return f"done/{key}"


# -- background persist -------------------------------------------------------------------------------
def background(key: str, step: str) -> str:
    """One step of a background persist (``start``, then each round)."""
    return f"bg/{key}/{step}"


# -- the health check ---------------------------------------------------------------------------------
def health(generation: int, step: str) -> str:
    """One step of the health check before ``generation``: hello, ready, partners, result, verdict."""
    return f"health/{generation}/{step}"


# -- machine-loss replication -------------------------------------------------------------------------
def replica_round(attempt: int, number: int) -> str:
    """One round of the nodes' copies to their buddies: which step all send, which all keep (``newest``/``kept``)."""
    return f"rep/{attempt}/round/{number}"


def replica_save(attempt: int, step: str) -> str:
    """One step of the survivors' commit after a node loss: have, plan, done, committed."""
    return f"rep/{attempt}/{step}"
