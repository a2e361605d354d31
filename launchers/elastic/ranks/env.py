"""What the training side reads from the environment mlaunch gives a rank — in one place.

Each was parsed in several modules, and the copies disagreed (three lists of rank variables).
Stdlib only and cheap: ``message_prefix`` calls ``env_rank`` from signal handlers.
"""

from __future__ import annotations

import os

SHM_DIR_ENV = "MLAUNCH_SHM_DIR"
RUN_ID_ENV = "MLAUNCH_RUN_ID"
ATTEMPT_ENV = "MLAUNCH_RESTART_COUNT"
KEEP_ENV = "MLAUNCH_CHECKPOINT_KEEP"
DEFAULT_KEEP = 3

# Where a launcher says a process's global rank: torchrun/mlaunch, Ascend's rank tables, Open MPI,
# MPICH/PMI, and MindSpore's dynamic cluster (a scheduler's node id), in that order of trust.
RANK_NAMES = ("RANK", "RANK_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MS_NODE_ID")
WORLD_NAMES = ("WORLD_SIZE", "RANK_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def shm_dir() -> str:
    """Where staged slots, progress files and import reports live (``$MLAUNCH_SHM_DIR``, else /dev/shm)."""
    return os.environ.get(SHM_DIR_ENV) or "/dev/shm"


def run_id() -> str:
    """This run's id; empty when the process does not run under mlaunch (nobody reads what it would report)."""
    return os.environ.get(RUN_ID_ENV, "")


def attempt() -> int:
    """The restart attempt this process belongs to (0: the first)."""
    return _int(os.environ.get(ATTEMPT_ENV, ""), 0)


def checkpoint_keep() -> int:
    """Committed checkpoints to keep (job.yaml's ``checkpoint.keep``, handed over by mlaunch)."""
    return _int(os.environ.get(KEEP_ENV, ""), DEFAULT_KEEP)


def env_rank(default: int = -1) -> int:
    """This process's global rank as the launcher said it; ``default`` when none did."""
    return _first(RANK_NAMES, default)


def env_world(default: int = 1) -> int:
    """The job's world size as the launcher said it; ``default`` when none did."""
    return _first(WORLD_NAMES, default)


def _first(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isascii() and value.isdigit():
            return int(value)
    return default


def _int(value: str, default: int) -> int:
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else default
