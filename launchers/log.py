"""The one way mlaunch talks to the user on stderr: ``mlaunch: message``, one write per line.

One ``write`` per message keeps lines whole when several processes share the terminal (ranks
and the launcher interleave there); the prefix names who speaks, e.g. ``mlaunch[head]``.
Standard library only: the node bootstrap, the TaskD manager side process and the in-training
runtime use it too.
"""

from __future__ import annotations

import sys


def say(message: str, *, who: str = "mlaunch") -> None:
    """Write ``who: message`` to stderr as one line, flushed."""
    stream = sys.stderr
    stream.write(f"{who}: {message}\n")
    stream.flush()
