"""Long phases say what they wait for: a line when they start and every few seconds until they end.

Waiting for the other nodes, the health check, a dying checkpoint or a restart's backoff can
take tens of seconds; a terminal that prints nothing meanwhile looks hung. ``long_phase``
prints "<what>…" once the phase took ``after`` seconds, then every ``every`` seconds with the
time so far, and how it ended ("<what>: done in 12.3s") when it printed anything at all.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from launchers.log import say


@contextlib.contextmanager
def long_phase(
    what: str, *, after: float = 2.0, every: float = 5.0, announce: Callable[[str], None] = say
) -> Iterator[None]:
    started = time.monotonic()
    done = threading.Event()
    printed = threading.Event()

    def tell() -> None:
        wait = after
        while not done.wait(wait):
            announce(f"{what}… {time.monotonic() - started:.0f}s")
            printed.set()
            wait = every

    thread = threading.Thread(target=tell, name="mlaunch-phase", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1)
        if printed.is_set():
            announce(f"{what}: over after {time.monotonic() - started:.1f}s")
