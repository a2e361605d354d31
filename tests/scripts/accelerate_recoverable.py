"""``examples/accelerate/train.py`` as written, its function that trains under ``@elastic.recoverable`` (issue 44).

Nothing else changes: a peer's failure calls ``main`` again in this process, which makes a new ``Accelerator``
(``launchers.elastic.in_place`` forgets Accelerate's process-wide state between the calls), resumes through
``MlaunchAccelerate`` and trains on. ``tests/test_trainers.py`` kills a rank of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "accelerate"))

import train  # noqa: E402 - the example, from its directory

from launchers import elastic  # noqa: E402

if __name__ == "__main__":
    elastic.recoverable(train.main)()
