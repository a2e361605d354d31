"""A trainer's example as written (``examples/<framework>/train.py``), its ``main`` under ``@elastic.recoverable``.

``recoverable_example.py FRAMEWORK [the example's arguments]``. Nothing else changes: a peer's failure calls
``main`` again in this process, which builds the framework's objects anew (``launchers.elastic.in_place``
forgets the framework's process-wide state between the calls), resumes through the integration and trains on.
``tests/test_trainers.py`` kills a rank of it (issue 44).
"""

from __future__ import annotations

import sys
from pathlib import Path

framework = sys.argv.pop(1)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / framework))

import train  # noqa: E402 - the example, from its directory

from launchers import elastic  # noqa: E402

if __name__ == "__main__":
    elastic.recoverable(train.main)()
