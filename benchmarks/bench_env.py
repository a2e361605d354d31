"""The environment every benchmark starts mlaunch with: this one, less any platform's variables.

A benchmark measures mlaunch's local simulation; a ModelArts/Volcano/torch variable left in the
shell it runs from (``MA_*``, ``RANK``, ``TF_CONFIG``...) would make mlaunch plan a platform node.
"""

from __future__ import annotations

import os

PLATFORM_PREFIXES = ("MA_", "VC_", "PET_", "MLAUNCH_", "TF_CONFIG")
TORCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def platform_free_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PLATFORM_PREFIXES)}
    for name in TORCH_NAMES:
        env.pop(name, None)
    return env
