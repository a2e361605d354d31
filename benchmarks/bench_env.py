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


def compile_sources() -> None:
    """The project's bytecode, written once before anything is measured (as ``tests/conftest.py`` does).

    Where ``PYTHONDONTWRITEBYTECODE`` is set (this VM sets it) no process may cache its bytecode, so every
    mlaunch, standby and rank of a fresh clone compiled what it imported again, some of it on the measured
    path: 2 netns hosts, kill -9 → first step in place, 0.209 s from a fresh clone, 0.143 s once compiled (the
    same session). ``compileall`` writes the caches whatever that variable says; a read-only tree goes without.
    """
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for tree in ("launchers", "examples", "tests/scripts", "benchmarks"):
        compileall.compile_dir(str(root / tree), quiet=2)
