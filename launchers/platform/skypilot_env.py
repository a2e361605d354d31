"""SkyPilot: the env its ``run:`` section sees on every node of a multi-node task.

SkyPilot's documented task env (docs "Environment variables", "Distributed multi-node jobs"):

- ``SKYPILOT_NODE_RANK`` — this node's index, 0 on the head node;
- ``SKYPILOT_NODE_IPS`` — one IP per line, in node-rank order (the head node first);
- ``SKYPILOT_NUM_NODES`` — the same count as ``SKYPILOT_NODE_IPS``'s lines;
- ``SKYPILOT_NUM_GPUS_PER_NODE`` — the count of ``accelerators: <name>:<count>`` (rounded up), 0
  without accelerators.

SkyPilot names no master: its own examples take the first IP (``head -n1``), and mlaunch does
the same. The port is job.yaml's ``pytorch.master_port`` or mlaunch's default.
"""

from __future__ import annotations

from collections.abc import Mapping

from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE
from launchers.errors import PlatformError
from launchers.platform.sighting import Sighting, env_int

SOURCE = "skypilot"
_NAMES = ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES")


def node_ips(raw: str) -> list[str]:
    """``SKYPILOT_NODE_IPS``: one address per line (a trailing newline is fine, an empty line in between is not)."""
    lines = [line.strip() for line in raw.strip().splitlines()]
    if not lines or any(not line or any(c.isspace() for c in line) for line in lines):
        raise PlatformError(
            f"platform env SKYPILOT_NODE_IPS={raw!r} is not one address per line; expected e.g. '10.0.0.1\\n10.0.0.2'"
        )
    if len(lines) > MAX_NODES:
        raise PlatformError(f"platform env SKYPILOT_NODE_IPS lists {len(lines)} nodes; at most {MAX_NODES} run")
    return lines


def from_skypilot_env(env: Mapping[str, str]) -> Sighting | None:
    """SkyPilot's node env, or None when none of its topology variables is set."""
    if not any(name in env for name in _NAMES):
        return None
    s = Sighting(SOURCE)
    nnodes = env_int(env, "SKYPILOT_NUM_NODES", minimum=1, maximum=MAX_NODES, meaning="the number of nodes")
    if nnodes is not None:
        s.put("nnodes", nnodes, f"SKYPILOT_NUM_NODES={nnodes}")
    if "SKYPILOT_NODE_IPS" in env:
        ips = node_ips(env["SKYPILOT_NODE_IPS"])
        if nnodes is not None and len(ips) != nnodes:
            raise PlatformError(
                f"platform inputs disagree on the number of nodes: SKYPILOT_NUM_NODES={nnodes} says {nnodes}, but "
                f"SKYPILOT_NODE_IPS lists {len(ips)} addresses ({', '.join(ips[:4])}{', ...' if len(ips) > 4 else ''})"
            )
        s.put("hosts", ips, "SKYPILOT_NODE_IPS")
        s.put("master_addr", ips[0], f"first line of SKYPILOT_NODE_IPS {ips[0]}")
        if nnodes is None:
            s.put("nnodes", len(ips), f"SKYPILOT_NODE_IPS ({len(ips)} addresses)")
    rank = env_int(env, "SKYPILOT_NODE_RANK", meaning="this node's index, from 0")
    if rank is not None:
        s.put("node_rank", rank, f"SKYPILOT_NODE_RANK={rank}")
    gpus = env_int(env, "SKYPILOT_NUM_GPUS_PER_NODE", maximum=MAX_PROCS_PER_NODE, meaning="GPUs per node")
    if gpus:  # 0: a CPU task, job.yaml's procs_per_node decides
        s.put("nproc", gpus, f"SKYPILOT_NUM_GPUS_PER_NODE={gpus}")
    return s
