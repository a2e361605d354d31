"""Wait for rank 0's store to listen before a rank other than 0 connects to it.

Shared by the warm standbys (a forked rank about to run the script) and ``elastic.recoverable`` (a
survivor about to call the training function again): both start within milliseconds of rank 0, and
a ``TCPStore`` client refused by a store that is not listening yet retries only after about 0.7 s.
Standard library only, outside ``launchers.elastic``: a standby importing that package would register
the ranks' stack-dump signal before it becomes a rank (a warm rank must look like a cold one).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def wait_for_listener(host: str, port: int, seconds: float, give_up: Callable[[], bool] | None = None) -> bool:
    """Wait until something accepts TCP connections on ``host:port`` (at most ``seconds``).

    A torch.distributed client (``TCPStore``) that connects before rank 0's store listens
    is refused and retries only after about 0.7 s: warm workers start within milliseconds of
    each other, so whether rank 0 or another rank got there first decided between a 0.15 s
    and a 0.8 s restart. Ranks other than 0 therefore wait here, before their script runs,
    for the store to listen. A probe that connects and closes at once is ignored by the
    store. False when nothing listened in time (the script then runs as it would have), or when
    ``give_up()`` said the wait no longer matters (a recovering rank's attempt was superseded).
    """
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0 or (give_up is not None and give_up()):
            return False
        try:
            with socket.create_connection((host, port), timeout=min(left, 0.5)):
                return True
        except OSError:
            time.sleep(min(0.002, max(0.0, end - time.monotonic())))
