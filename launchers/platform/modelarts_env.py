"""ModelArts env and Volcano's svc/env plugins: node count, this node's index, per-node host names.

ModelArts: ``MA_NUM_HOSTS``, ``MA_NUM_GPUS``, ``VC_TASK_INDEX`` (fallback ``VK_TASK_INDEX``,
``MA_TASK_INDEX``), ``VC_WORKER_HOSTS`` or names built from ``MA_VJ_NAME``/``MA_TASK_NAME``
(``ma-job`` → ``modelarts-job``). Volcano alone: ``VC_WORKER_HOSTS``, ``VC_WORKER_NUM``,
``VC_TASK_INDEX``.
"""

from __future__ import annotations

from collections.abc import Mapping

from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE
from launchers.errors import PlatformError
from launchers.platform.sighting import Sighting, env_int


def normalise_vj_name(name: str) -> str:
    """ModelArts job names appear as ``ma-job-…``; DNS names use ``modelarts-job-…``."""
    return name.replace("ma-job", "modelarts-job", 1)


def modelarts_hosts(env: Mapping[str, str], count: int | None) -> list[str]:
    """Per-node DNS names: ``VC_WORKER_HOSTS``, else ``<job>-<task>-<i>.<job>`` from MA_VJ_NAME."""
    raw = env.get("VC_WORKER_HOSTS", "").strip()
    if raw:
        hosts = [h.strip() for h in raw.split(",")]
        if any(not h for h in hosts):
            raise PlatformError(f"platform env VC_WORKER_HOSTS={raw!r} has an empty entry; expected host1,host2,...")
        return hosts
    vj = env.get("MA_VJ_NAME", "").strip()
    if vj and count:
        job = normalise_vj_name(vj)
        task = env.get("MA_TASK_NAME", "worker").strip() or "worker"
        return [f"{job}-{task}-{i}.{job}" for i in range(count)]
    return []


def task_index(env: Mapping[str, str]) -> tuple[int | None, str]:
    """This node's index from VC_TASK_INDEX, VK_TASK_INDEX or MA_TASK_INDEX, and where it came from."""
    for name in ("VC_TASK_INDEX", "VK_TASK_INDEX", "MA_TASK_INDEX"):
        value = env_int(env, name, meaning="this node's index, from 0")
        if value is not None:
            return value, f"{name}={value}"
    return None, ""


def from_modelarts_env(env: Mapping[str, str]) -> Sighting | None:
    """ModelArts' own env (MA_NUM_HOSTS / MA_VJ_NAME present), or None."""
    if not any(k in env for k in ("MA_NUM_HOSTS", "MA_VJ_NAME")):
        return None
    s = Sighting("modelarts")
    nnodes = env_int(env, "MA_NUM_HOSTS", minimum=1, maximum=MAX_NODES, meaning="the number of nodes")
    if nnodes is not None:
        s.put("nnodes", nnodes, f"MA_NUM_HOSTS={nnodes}")
    hosts = modelarts_hosts(env, nnodes)
    if hosts:
        if nnodes is not None and len(hosts) != nnodes:
            raise PlatformError(
                f"platform env VC_WORKER_HOSTS lists {len(hosts)} hosts but MA_NUM_HOSTS={nnodes}; "
                "expected one host per node"
            )
        s.put("hosts", hosts, "VC_WORKER_HOSTS" if env.get("VC_WORKER_HOSTS") else "MA_VJ_NAME")
        s.put("master_addr", hosts[0], f"first host {hosts[0]}")
        if nnodes is None:
            s.put("nnodes", len(hosts), f"VC_WORKER_HOSTS ({len(hosts)} hosts)")
    index, origin = task_index(env)
    if index is not None:
        s.put("node_rank", index, origin)
    gpus = env_int(env, "MA_NUM_GPUS", maximum=MAX_PROCS_PER_NODE, meaning="accelerators per node")
    if gpus:
        s.put("nproc", gpus, f"MA_NUM_GPUS={gpus}")
    return s


def from_volcano_env(env: Mapping[str, str]) -> Sighting | None:
    """Volcano's svc/env plugins alone (VC_WORKER_HOSTS), or None."""
    if not env.get("VC_WORKER_HOSTS", "").strip():
        return None
    s = Sighting("volcano")
    hosts = modelarts_hosts(env, None)
    s.put("hosts", hosts, "VC_WORKER_HOSTS")
    s.put("master_addr", hosts[0], f"first host of VC_WORKER_HOSTS {hosts[0]}")
    num = env_int(env, "VC_WORKER_NUM", minimum=1, meaning="the number of worker pods")
    if num is not None and num != len(hosts):
        raise PlatformError(f"platform env VC_WORKER_NUM={num} but VC_WORKER_HOSTS lists {len(hosts)} hosts")
    s.put("nnodes", len(hosts), f"VC_WORKER_HOSTS ({len(hosts)} hosts)")
    index, origin = task_index(env)
    if index is not None:
        s.put("node_rank", index, origin)
    return s
