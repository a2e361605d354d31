"""ModelArts' per-device start, and which copy of mlaunch does node-level work.

On ModelArts' Ascend-Powered-Engine the start file runs once **per device**, each copy with
``ASCEND_DEVICE_ID`` (logical device, from 0) and ``RANK_ID`` already set. When mlaunch is that
start file, each copy must start just its own rank, and only the copy with
``ASCEND_DEVICE_ID=0`` may do node-level work (pre-start installs, sshd, a TaskD manager),
or it would be done eight times at once (platform_spec.md §1.4).

Other parts ask ``is_node_leader()``; processes see ``MLAUNCH_NODE_LEADER=1`` in the one
process per node that belongs to the leader (local rank 0). Stdlib only: cheap to import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from launchers.config.limits import MAX_PROCS_PER_NODE, MAX_WORLD_SIZE
from launchers.platform.numbers import parse_int

NODE_LEADER_ENV = "MLAUNCH_NODE_LEADER"


def per_device_start(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(ASCEND_DEVICE_ID, RANK_ID) when the platform started this copy for one device, else None."""
    env = os.environ if env is None else env
    device = env.get("ASCEND_DEVICE_ID", "").strip()
    rank = env.get("RANK_ID", "").strip()
    if not device or not rank:
        return None
    return (
        parse_int(
            device, "platform env ASCEND_DEVICE_ID", maximum=MAX_PROCS_PER_NODE - 1, meaning="a device index ≥ 0"
        ),
        parse_int(rank, "platform env RANK_ID", maximum=MAX_WORLD_SIZE - 1, meaning="a rank ≥ 0"),
    )


def is_node_leader(env: Mapping[str, str] | None = None) -> bool:
    """Whether this copy of mlaunch should do node-level work.

    True unless the platform started one copy per device and this is not device 0. Inside a
    process mlaunch started, ``MLAUNCH_NODE_LEADER`` (set by the plan) is the answer.
    """
    env = os.environ if env is None else env
    marked = env.get(NODE_LEADER_ENV)
    if marked is not None:
        return marked == "1"
    started = per_device_start(env)
    return started is None or started[0] == 0
