"""Signals to mlaunch during a run, as bytes on a pipe the supervisor's selector watches."""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from launchers import stop_signals as early_signals
from launchers.procs import reap_unknown

FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # preemption notices: forwarded, nothing stops


class SignalRouter:
    """Turns signals into bytes on a pipe the supervisor's selector watches.

    Installed once per mlaunch run (it outlives restarts and the backoff between them). The
    Python handlers do nothing: ``signal.set_wakeup_fd`` writes each signal number to the
    pipe. Outside the main thread signals cannot be caught; the supervisor then polls.
    """

    HANDLED = (*early_signals.STOP_SIGNALS, *FORWARD_SIGNALS, signal.SIGCHLD)

    def __init__(self) -> None:
        self.active = False
        self.read_fd = -1
        self._write_fd = -1
        self._previous: dict[int, object] = {}
        self._old_wakeup = -1
        self.pending: list[int] = []

    def __enter__(self) -> SignalRouter:
        if threading.current_thread() is not threading.main_thread():
            return self
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)
        for sig in self.HANDLED:
            self._previous[sig] = signal.signal(sig, _noop_handler)
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self.active = True
        self.pending.extend(early_signals.take())  # what came before these handlers (mlaunch's start-up)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        signal.set_wakeup_fd(self._old_wakeup)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        os.close(self.read_fd)
        os.close(self._write_fd)
        self.active = False

    def drain(self) -> list[int]:
        """Signals received since the last call, in order."""
        got, self.pending = self.pending, []
        if self.active:
            while True:
                try:
                    data = os.read(self.read_fd, 512)
                except BlockingIOError:
                    break
                if not data:
                    break
                got.extend(data)
        return got

    def wait(self, seconds: float) -> list[int]:
        """Sleep up to ``seconds`` but return early with any stop/forward signal received."""
        end = time.monotonic() + seconds
        while True:
            sigs = [s for s in self.drain() if s != signal.SIGCHLD]
            reap_unknown()
            if sigs:
                return sigs
            left = end - time.monotonic()
            if left <= 0:
                return []
            if self.active:
                select.select([self.read_fd], [], [], left)
            else:
                time.sleep(min(left, 0.1))


def _noop_handler(signum: int, frame: object) -> None:
    """Handled only so set_wakeup_fd reports it; the supervisor loop does the work."""
