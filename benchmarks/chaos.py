"""``python benchmarks/chaos.py ...``: the command the issues and earlier notes name, kept working.

The harness is the package ``benchmarks/chaos/`` (``python -m benchmarks.chaos`` or
``python benchmarks/chaos``); this file only runs it with the same arguments. Run as a script,
``benchmarks/`` is first on ``sys.path``, so ``import chaos`` would find the package, not this file,
which is why it runs the package by its full name from the repository root.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    root = str(Path(__file__).resolve().parent.parent)
    sys.path[:] = [root, *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent)]
    runpy.run_module("benchmarks.chaos", run_name="__main__", alter_sys=True)
