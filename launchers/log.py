"""The one way mlaunch talks to the user on stderr: ``mlaunch: message``, one write per line.

One ``write`` per message keeps lines whole when several processes share the terminal (ranks
and the launcher interleave there); the prefix names who speaks, e.g. ``mlaunch[head]``.
Standard library only: the node bootstrap, the TaskD manager side process and the in-training
runtime use it too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def say(message: str, *, who: str = "mlaunch") -> None:
    """Write ``who: message`` to stderr as one line, flushed; never raises.

    It may run inside a signal handler that interrupted a write to ``sys.stderr``: the
    re-entrant buffered write raises RuntimeError (a closed or missing stderr raises the
    others). Nothing may escape into the caller (a training loop, a supervisor), so the line
    then goes to file descriptor 2 itself, unbuffered.
    """
    line = f"{who}: {message}\n"
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (RuntimeError, ValueError, AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.write(2, line.encode(errors="replace"))


def signal_name(sig: int) -> str:
    """``SIGTERM`` for 15: how messages name a signal (``signal 77`` for one without a name)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
