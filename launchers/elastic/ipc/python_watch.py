"""Does the main thread still run Python? ``hang_timeout: auto``'s question before it judges a silent rank.

A daemon thread asks the interpreter every ``PYTHON_EVERY`` seconds to run a tiny pending call, which
runs only between two bytecodes of the main thread (``Py_AddPendingCall``); the call stamps the time
into the rank's progress file (``progress``). A forked child (a data-loader worker) has no thread until
it becomes a rank itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

PYTHON_EVERY = 0.25  # seconds between two stamps of the main thread running Python


_stamp: Callable[[], None] | None = None  # what a pending call runs (``progress``: the time into the rank's file)
_watching = 0  # the pid whose thread asks (0: none): a forked child has none until it becomes a rank
_watch_stop = False


def _ran_python(_arg: object) -> int:
    """Run by the main thread between two bytecodes (a pending call): stamp the time."""
    try:
        if _stamp is not None:
            _stamp()
    except Exception:  # noqa: BLE001,S110 - never disturb the rank (interpreter shutting down...)
        pass
    return 0


def _pending_call() -> Callable[[], object] | None:
    """``Py_AddPendingCall(_ran_python)`` as a function of no argument; None where ctypes cannot do it."""
    try:
        import ctypes

        callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(_ran_python)
        # never freed: a pending call may still run while the interpreter shuts down
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(callback))
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        add.restype = ctypes.c_int
        pointer = ctypes.cast(callback, ctypes.c_void_p)
    except (ImportError, AttributeError, OSError, TypeError):
        return None
    return lambda: add(pointer, None)


def start(stamp: Callable[[], None]) -> None:
    """A daemon thread asks the main thread to run ``stamp`` every ``PYTHON_EVERY`` seconds.

    The stamp is written only when the main thread executes bytecode: a rank evaluating, saving
    or loading data keeps it fresh; one stopped (SIGSTOP), stuck in a driver, or blocked in a
    collective, a lock or a sleep does not. Costs one pending call every quarter second.
    """
    global _watching, _watch_stop, _stamp
    _stamp = stamp
    if _watching == os.getpid():
        return
    add = _pending_call()
    if add is None:
        return
    import atexit
    import threading

    _watching, _watch_stop = os.getpid(), False
    pid = _watching

    def ask() -> None:
        while not _watch_stop and _watching == pid and os.getpid() == pid:
            add()
            time.sleep(PYTHON_EVERY)

    def stop() -> None:
        global _watch_stop
        _watch_stop = True

    atexit.register(stop)
    threading.Thread(target=ask, name="mlaunch-python-watch", daemon=True).start()
