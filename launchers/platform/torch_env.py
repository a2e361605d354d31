"""A torch launcher's env, per platform that sets it.

- Kubeflow PyTorchJob: ``PET_NNODES`` (a count or an elastic ``MIN:MAX``), ``PET_NODE_RANK``,
  ``PET_NPROC_PER_NODE``, ``PET_RDZV_ENDPOINT``, ``MASTER_ADDR``/``MASTER_PORT``, ``RANK``,
  ``WORLD_SIZE`` = pods × nproc;
- MindCluster's ascend-operator: ``MINDX_TASK_ID`` with ``LOCAL_WORLD_SIZE``; ``WORLD_SIZE``
  counts devices;
- the Volcano pytorch plugin: ``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE`` = pods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from launchers.address import parse_tcp_url
from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE
from launchers.errors import PlatformError
from launchers.platform.sighting import Sighting, env_int
from launchers.platform.trainer_env import is_trainer_env

_PET_NAMES = ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_RDZV_ENDPOINT")


def from_torch_env(env: Mapping[str, str]) -> Sighting | None:
    """The sighting of whichever torch launcher set this env (MindCluster, Kubeflow, Volcano), or None.

    Trainer v2's ``PET_*`` env is ``trainer_env``'s, not a v1 PyTorchJob's.
    """
    if "MINDX_TASK_ID" in env and "LOCAL_WORLD_SIZE" in env:
        s = _mindcluster(env)
    elif is_trainer_env(env):
        return None
    elif any(k in env for k in _PET_NAMES):
        s = _kubeflow(env)
    elif "MASTER_ADDR" in env and "RANK" in env and "WORLD_SIZE" in env:
        s = _volcano_pytorch(env)
    else:
        return None
    _add_master(s, env)
    return s


def _mindcluster(env: Mapping[str, str]) -> Sighting:
    s = Sighting("mindcluster")
    local = env_int(env, "LOCAL_WORLD_SIZE", minimum=1, maximum=MAX_PROCS_PER_NODE, meaning="NPUs per pod")
    world = env_int(env, "WORLD_SIZE", minimum=1, meaning="total NPUs (MindCluster counts devices)")
    assert local is not None
    s.put("nproc", local, f"LOCAL_WORLD_SIZE={local}")
    if world is not None:
        if world % local:
            raise PlatformError(
                f"MindCluster env WORLD_SIZE={world} (devices) is not a multiple of LOCAL_WORLD_SIZE={local} "
                "(devices per pod)"
            )
        s.put("nnodes", world // local, f"WORLD_SIZE={world}/LOCAL_WORLD_SIZE={local}")
    rank = env_int(env, "RANK", meaning="the pod rank")
    if rank is not None:
        s.put("node_rank", rank, f"RANK={rank}")
    return s


def _kubeflow(env: Mapping[str, str]) -> Sighting:
    s = Sighting("kubeflow-pytorchjob")
    _put_pet_nnodes(s, env)
    rank = env_int(env, "PET_NODE_RANK", meaning="the node rank")
    if rank is None:
        rank = env_int(env, "RANK", meaning="the pod rank")
        if rank is not None:
            s.put("node_rank", rank, f"RANK={rank}")
    else:
        s.put("node_rank", rank, f"PET_NODE_RANK={rank}")
    nproc = env.get("PET_NPROC_PER_NODE")
    if nproc is not None and nproc.strip() not in ("auto", "gpu", "cpu"):
        count = env_int(
            env, "PET_NPROC_PER_NODE", minimum=1, maximum=MAX_PROCS_PER_NODE, meaning="a number of processes per node"
        )
        s.put("nproc", count, f"PET_NPROC_PER_NODE={count}")
    world = env_int(env, "WORLD_SIZE", minimum=1, meaning="pods × processes per node")
    if world is not None:
        s.put("world_size_env", world, f"WORLD_SIZE={world}")
    return s


def _put_pet_nnodes(s: Sighting, env: Mapping[str, str]) -> None:
    """``PET_NNODES``: a node count, or an elastic ``MIN:MAX`` (then MIN nodes, and the range kept)."""
    spec = env.get("PET_NNODES", "").strip()
    if not spec and "PET_NNODES" not in env:
        return
    if re.fullmatch(r"[0-9]{1,9}:[0-9]{1,9}", spec):
        lo, hi = (int(x) for x in spec.split(":"))
        if lo < 1 or hi < lo or hi > MAX_NODES:
            raise PlatformError(f"platform env PET_NNODES={spec!r}: expected MIN:MAX with 1 ≤ MIN ≤ MAX ≤ {MAX_NODES}")
        s.put("nnodes_spec", spec, f"PET_NNODES={spec}")
        s.put("nnodes", lo, f"PET_NNODES={spec}")
    else:
        nn = env_int(env, "PET_NNODES", minimum=1, maximum=MAX_NODES, meaning="the number of nodes or MIN:MAX")
        s.put("nnodes", nn, f"PET_NNODES={nn}")


def _volcano_pytorch(env: Mapping[str, str]) -> Sighting:
    s = Sighting("volcano-pytorch")
    world = env_int(env, "WORLD_SIZE", minimum=1, meaning="the number of pods (Volcano pytorch plugin)")
    rank = env_int(env, "RANK", meaning="the pod rank")
    s.put("nnodes", world, f"WORLD_SIZE={world}")
    s.put("node_rank", rank, f"RANK={rank}")
    return s


def _add_master(s: Sighting, env: Mapping[str, str]) -> None:
    """The rendezvous address: ``PET_RDZV_ENDPOINT`` (elastic PyTorchJob), else ``MASTER_ADDR``/``MASTER_PORT``."""
    endpoint = env.get("PET_RDZV_ENDPOINT", "").strip()
    if endpoint:  # elastic PyTorchJob: torchrun's rendezvous endpoint (host:port), not a master
        rdzv_host, rdzv_port = parse_tcp_url(f"tcp://{endpoint}", "PET_RDZV_ENDPOINT")
        s.put("master_addr", rdzv_host, f"PET_RDZV_ENDPOINT={endpoint}")
        s.put("master_port", rdzv_port, f"PET_RDZV_ENDPOINT={endpoint}")
    if env.get("MASTER_ADDR") and "master_addr" not in s.facts:
        s.put("master_addr", env["MASTER_ADDR"].strip(), f"MASTER_ADDR={env['MASTER_ADDR']}")
    port = env_int(env, "MASTER_PORT", minimum=1, maximum=65535, meaning="a TCP port (1..65535)")
    if port is not None and "master_port" not in s.facts:
        s.put("master_port", port, f"MASTER_PORT={port}")
