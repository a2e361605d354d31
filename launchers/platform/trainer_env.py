"""Kubeflow Trainer v2 (TrainJob): the env its torch plugin injects, and what its MPI plugin mounts.

Trainer v2.3.0's torch plugin (``pkg/runtime/framework/plugins/torch/torch.go``) puts into the
``node`` container of every trainer pod:

- ``PET_NNODES`` = ``trainer.numNodes`` (a plain count; Trainer has no elastic range);
- ``PET_NPROC_PER_NODE`` = ``trainer.numProcPerNode``, or ``auto`` when none is given and the
  node requests GPUs (torchrun then starts one process per visible GPU);
- ``PET_NODE_RANK`` = the pod's Indexed-Job completion index (downward API);
- ``PET_MASTER_ADDR`` = ``<trainjob>-node-0-0.<trainjob>``, ``PET_MASTER_PORT`` = 29500.

Unlike the v1 PyTorchJob it sets no ``MASTER_ADDR``, ``RANK`` or ``WORLD_SIZE``; Kubernetes sets
``JOB_COMPLETION_INDEX`` in every pod of an Indexed Job (JobSet's Jobs are), the same index as
``PET_NODE_RANK``. That is how the two are told apart: ``PET_MASTER_ADDR`` without
``MASTER_ADDR``, or ``PET_*`` beside ``JOB_COMPLETION_INDEX``.

MPI runtimes (``mlPolicy.mpi``): the launcher pod gets the hostfile ConfigMap at
``/etc/mpi/hostfile`` (``<host> slots=<n>`` per node, ``OMPI_MCA_orte_default_hostfile`` names
it) and every pod the ssh Secret ``<trainjob>-mpi-ssh-auth`` at ``sshAuthMountPath``; the
launcher's hostfile is read by ``trainer_mpi.py`` (source ``kubeflow-trainer-mpi``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE
from launchers.errors import PlatformError
from launchers.platform.sighting import Sighting, env_int

SOURCE = "kubeflow-trainer"
TRAINER_PORT = 29500  # constants.ContainerTrainerPort: PET_MASTER_PORT and the node container's port
_PET_NAMES = ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "PET_MASTER_PORT")
_NVIDIA_DEVICE = re.compile(r"nvidia[0-9]{1,4}")
_MASTER_NAME = re.compile(r"(?P<job>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-node-0-0\.(?P<domain>[-a-z0-9.]+)")


def is_trainer_env(env: Mapping[str, str]) -> bool:
    """Trainer v2's torch env rather than a v1 PyTorchJob's (which sets ``MASTER_ADDR`` beside ``PET_*``)."""
    if "PET_MASTER_ADDR" in env and "MASTER_ADDR" not in env:
        return True
    return "JOB_COMPLETION_INDEX" in env and any(name in env for name in _PET_NAMES)


def visible_gpus(env: Mapping[str, str], dev_dir: Path = Path("/dev")) -> int:
    """What torchrun's ``auto`` counts on a GPU node: ``CUDA_VISIBLE_DEVICES`` entries, else ``/dev/nvidiaN``.

    Read without importing torch (planning stays cheap). An empty ``CUDA_VISIBLE_DEVICES``
    hides every GPU, as it does for CUDA.
    """
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip()])
    try:
        return sum(1 for entry in os.listdir(dev_dir) if _NVIDIA_DEVICE.fullmatch(entry))
    except OSError:
        return 0


def node_hosts(master: str, nnodes: int | None) -> list[str]:
    """Every node's DNS name when the master is JobSet's ``<job>-node-0-0.<job>``: node i's is ``<job>-node-0-i.<job>``.

    JobSet names pod i of replicated Job ``node`` ``<jobset>-node-0-i`` under the subdomain ``<jobset>``.
    """
    match = _MASTER_NAME.fullmatch(master)
    if match is None or nnodes is None:
        return []
    return [f"{match['job']}-node-0-{i}.{match['domain']}" for i in range(nnodes)]


def from_trainer_env(env: Mapping[str, str], dev_dir: Path = Path("/dev")) -> Sighting | None:
    """Trainer v2's torch plugin env, else the hostfile of its MPI launcher pod, else None."""
    if not is_trainer_env(env):
        if "JOB_COMPLETION_INDEX" not in env:
            return None  # not a Trainer pod at all: its MPI reader stays unimported
        from launchers.platform.trainer_mpi import from_trainer_hostfile

        return from_trainer_hostfile(env)
    s = Sighting(SOURCE)
    nnodes = env_int(env, "PET_NNODES", minimum=1, maximum=MAX_NODES, meaning="the number of nodes")
    if nnodes is not None:
        s.put("nnodes", nnodes, f"PET_NNODES={nnodes}")
    _put_node_rank(s, env)
    _put_nproc(s, env, dev_dir)
    master = env.get("PET_MASTER_ADDR")
    if master is not None:
        if not master.strip():
            raise PlatformError("platform env PET_MASTER_ADDR is set but empty; expected the master's host name")
        s.put("master_addr", master.strip(), f"PET_MASTER_ADDR={master.strip()}")
        hosts = node_hosts(master.strip(), nnodes)
        if hosts:
            s.put("hosts", hosts, f"PET_MASTER_ADDR={master.strip()} (JobSet names node i <job>-node-0-i.<job>)")
    port = env_int(env, "PET_MASTER_PORT", minimum=1, maximum=65535, meaning="a TCP port (1..65535)")
    if port is not None:
        s.put("master_port", port, f"PET_MASTER_PORT={port}")
    world = env_int(env, "WORLD_SIZE", minimum=1, meaning="nodes × processes per node")
    if world is not None:  # Trainer sets none; one from elsewhere must still fit PET_NNODES × PET_NPROC_PER_NODE
        s.put("world_size_env", world, f"WORLD_SIZE={world}")
    return s


def _put_node_rank(s: Sighting, env: Mapping[str, str]) -> None:
    """``PET_NODE_RANK``, else ``JOB_COMPLETION_INDEX``; both set must agree (they are the same index)."""
    rank = env_int(env, "PET_NODE_RANK", meaning="this node's index, from 0")
    index = env_int(env, "JOB_COMPLETION_INDEX", meaning="this pod's index in its Indexed Job, from 0")
    if rank is not None and index is not None and rank != index:
        raise PlatformError(
            f"platform inputs disagree on this node's index: PET_NODE_RANK={rank} ({SOURCE}) says {rank}, but "
            f"JOB_COMPLETION_INDEX={index} (the pod's Indexed Job) says {index}. Trainer sets both from the same "
            "completion index; something else overrode one of them, and mlaunch will not guess which is right."
        )
    if rank is not None:
        s.put("node_rank", rank, f"PET_NODE_RANK={rank}")
    elif index is not None:
        s.put("node_rank", index, f"JOB_COMPLETION_INDEX={index}")


def _put_nproc(s: Sighting, env: Mapping[str, str], dev_dir: Path) -> None:
    """A number, or ``auto``: one process per visible GPU as torchrun does, else job.yaml's procs_per_node."""
    raw = env.get("PET_NPROC_PER_NODE")
    if raw is None:
        return
    if raw.strip() == "auto":
        gpus = visible_gpus(env, dev_dir)
        if gpus:
            s.put("nproc", min(gpus, MAX_PROCS_PER_NODE), f"PET_NPROC_PER_NODE=auto ({gpus} visible GPUs)")
        return  # no GPU: job.yaml's procs_per_node (Trainer writes a CPU count itself for CPU-only nodes)
    count = env_int(
        env,
        "PET_NPROC_PER_NODE",
        minimum=1,
        maximum=MAX_PROCS_PER_NODE,
        meaning="a number of processes per node, or auto",
    )
    s.put("nproc", count, f"PET_NPROC_PER_NODE={count}")
