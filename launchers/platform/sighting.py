"""Sightings: what one platform input says about the job's shape, and merging them.

Each input (appended args, a torch launcher's env, ModelArts env, Volcano env) becomes a
``Sighting`` of facts, each with the ``VAR=value`` it came from. Merged in precedence order,
the first input that states a fact wins; a number stated by two inputs must agree, or the
error names both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launchers.errors import PlatformError
from launchers.platform.numbers import env_int as env_int  # the one integer reader, re-exported


@dataclass
class Sighting:
    source: str
    facts: dict[str, object] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # fact → "VAR=value" for messages

    def put(self, fact: str, value: object, origin: str) -> None:
        self.facts[fact] = value
        self.origins[fact] = origin


_FACT_WORDS = {
    "nnodes": "the number of nodes",
    "node_rank": "this node's index",
    "nproc": "processes per node",
    "master_port": "the master port",
}


def merge_sightings(sightings: list[Sighting]) -> dict[str, object]:
    """First sighting wins per fact; numeric facts stated twice must agree."""
    merged: dict[str, object] = {}
    origin_of: dict[str, str] = {}
    for s in sightings:
        for fact, value in s.facts.items():
            if fact not in merged:
                merged[fact] = value
                origin_of[fact] = f"{s.origins[fact]} ({s.source})"
            elif fact in _FACT_WORDS and merged[fact] != value:
                raise PlatformError(
                    f"platform inputs disagree on {_FACT_WORDS[fact]}: {origin_of[fact]} says {merged[fact]}, "
                    f"but {s.origins[fact]} ({s.source}) says {value}. Fix the job's platform settings; "
                    "mlaunch will not guess which one is right."
                )
    merged["_origins"] = origin_of
    return merged
