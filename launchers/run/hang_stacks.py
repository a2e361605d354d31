"""Every process's Python stacks into its log when a hang is declared, and the innermost frame read back.

Kept apart from the hang verdict (``hang``): this is what the supervisor does with the verdict's
processes before anything is killed — the stack signal (``launchers.elastic`` registered
``faulthandler`` on it), ``py-spy`` for ranks that never imported ``launchers.elastic``, and the
parsing of a ``faulthandler`` dump for the frame the failure names.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable

from launchers.elastic.ipc import progress
from launchers.procs import STOPPED_STATES, process_state, signal_group
from launchers.run.streams import Worker

DUMP_WAIT = 2.0  # at most this long for the stacks to arrive before the stop goes on
DUMP_QUIET = 0.3  # ... or until the ranks have been silent this long after the signal
ANSWERED_QUIET = 0.1  # ... or this long, once every rank that can answer has begun its dump (its rest follows at once)
MAX_STACK_BYTES = 1 << 20  # of a log read back for a frame: a dump is a few KiB
PY_SPY_TIMEOUT = 10.0


_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+.*\(most recent call first\):\s*$")
_THREAD_IN = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')


def answered_stack_request(text: str) -> bool:
    """The process wrote a ``faulthandler`` dump (a thread header) into ``text``: it could still run."""
    return _THREAD_IN.search(text) is not None


def _threads(text: str) -> list[tuple[bool, list[tuple[str, str, str]]]]:
    """The thread blocks of a ``faulthandler`` dump: (is the current thread, its frames innermost first)."""
    threads: list[tuple[bool, list[tuple[str, str, str]]]] = []
    for line in text.splitlines():
        if m := _THREAD.match(line):
            threads.append((m.group(1) == "Current thread", []))
        elif threads and (f := _FRAME.match(line)):
            threads[-1][1].append((f.group(1), f.group(2), f.group(3)))
    return [t for t in threads if t[1]]


def _outermost(frame: tuple[str, str, str]) -> bool:
    """A main thread's last frame: a script's module level, or runpy (``-m``; ``<frozen runpy>`` since 3.11)."""
    return frame[2] == "<module>" or frame[0].endswith("runpy.py") or frame[0] == "<frozen runpy>"


def main_thread_dumped(text: str) -> bool:
    """The dump in ``text`` holds the main thread's block down to its outermost frame (the script, or runpy).

    ``faulthandler`` writes every thread from its signal handler in one go, newest thread first, so the
    main thread's block is the last: once its outermost frame is in the log the dump is whole, and
    waiting longer for more output only delays the recovery.
    """
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a line still being written is not read
    return any(_outermost(frames[-1]) for _, frames in _threads(text))


def innermost_frame(text: str) -> str | None:
    """``file.py:LINE in function``: the innermost frame of the main thread in a ``faulthandler`` dump.

    The main thread is the one whose outermost frame is the script (``<module>``) or ``runpy``;
    else the thread the signal interrupted (``Current thread``); else the first one listed.
    """
    threads = _threads(text)
    if not threads:
        return None
    main = [t for t in threads if _outermost(t[1][-1])]
    current = [t for t in threads if t[0]]
    path, line, function = (main or current or threads)[0][1][0]
    return f"{os.path.basename(path)}:{line} in {function}"


def dump_stacks(
    workers: list[Worker],
    *,
    run_id: str,
    pump: Callable[[float], bool],
    announce: Callable[[str], None],
) -> None:
    """Every process's Python stacks into its log, before anything is killed.

    The stack signal goes to each rank that registered it (``launchers.elastic``), and only to
    that process: its DataLoader workers inherited the handler and would write their stacks into
    the same log at the same moment, interleaved line by line. A process without a registered
    rank in its tree (a wrapper that started one some other way) gets it for its whole group
    (SIGURG is ignored by whoever did not register it); ranks that never imported
    ``launchers.elastic`` get ``py-spy dump`` when it is installed. ``pump`` reads the workers'
    output (so the stacks reach the logs) and says whether any arrived; this returns once they
    stopped arriving, within ``DUMP_WAIT``: at once when every rank that can answer has its main
    thread's whole stack in its log (``main_thread_dumped``), ``ANSWERED_QUIET`` after the last
    output once each has begun its dump, else ``DUMP_QUIET`` (a stopped or D-state rank cannot
    answer: it is the culprit, and waiting for it cost every in-place recovery from a hang 0.3 s;
    the quiet period after the answers cost it another 0.1 s).
    """
    registered = {p.pid for p in progress.read_run(run_id) if p.stack_signal}
    marks = log_marks(workers)  # where each one's dump will start in its log
    unregistered = [w for w in workers if not _has_registered(w, registered)]
    for worker in unregistered:
        signal_group(worker.pid, progress.STACK_SIGNAL)
    for pid in registered:  # the rank alone, wherever it is (under a wrapper that made a group of its own too)
        with contextlib.suppress(OSError):
            os.kill(pid, progress.STACK_SIGNAL)
    spies = _py_spy(unregistered)
    answering = None if unregistered else _answering_logs(workers, registered, marks)
    end = time.monotonic() + DUMP_WAIT
    quiet_since = time.monotonic()
    while time.monotonic() < end:
        texts = None if answering is None else [read_log_from(path, offset) for path, offset in answering]
        if texts is not None and all(main_thread_dumped(text) for text in texts):
            break
        quiet = ANSWERED_QUIET if texts is not None and all(map(answered_stack_request, texts)) else DUMP_QUIET
        if pump(min(quiet, max(0.0, end - time.monotonic()))):
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet:
            break
    _collect_py_spy(spies, announce)
    announce(f"stacks of {len(workers)} processes written to their logs (signal {progress.STACK_SIGNAL.name})")


def log_marks(workers: Iterable[Worker]) -> dict[int, tuple[str, int]]:
    """Where each worker stands in its log now (pid → path, offset); workers without a log file are left out."""
    marks = {}
    for worker in workers:
        log = worker.log
        if worker.spec.log and log is not None and not log.closed:
            with contextlib.suppress(OSError, ValueError):
                marks[worker.pid] = (worker.spec.log, log.tell())
    return marks


def read_log_from(path: str, offset: int) -> str:
    """What a log holds from ``offset`` on ("" where unreadable), at most ``MAX_STACK_BYTES``."""
    with contextlib.suppress(OSError), open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(MAX_STACK_BYTES).decode("utf-8", "replace")
    return ""


def _answering_logs(
    workers: list[Worker], registered: set[int], marks: dict[int, tuple[str, int]]
) -> list[tuple[str, int]] | None:
    """The logs where an answer must appear: every rank that can run; None when one's answer cannot be told
    (a rank under a wrapper, a worker without a log file): then only the quiet period ends the wait."""
    logs = []
    for worker in workers:
        if process_state(worker.pid) in STOPPED_STATES | {"D", "Z", ""}:
            continue
        if worker.pid not in registered or worker.pid not in marks:
            return None
        logs.append(marks[worker.pid])
    return logs


def _has_registered(worker: Worker, registered: set[int]) -> bool:
    if worker.pid in registered:
        return True
    with contextlib.suppress(Exception):
        import psutil

        return any(child.pid in registered for child in psutil.Process(worker.pid).children(recursive=True))
    return False


def _py_spy(workers: Iterable[Worker]) -> list[tuple[Worker, subprocess.Popen[bytes]]]:
    exe = shutil.which("py-spy")
    if exe is None:
        return []
    spies = []
    for worker in workers:
        with contextlib.suppress(OSError):
            popen = subprocess.Popen(
                [exe, "dump", "--pid", str(worker.pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            spies.append((worker, popen))
    return spies


def _collect_py_spy(spies: list[tuple[Worker, subprocess.Popen[bytes]]], announce: Callable[[str], None]) -> None:
    for worker, popen in spies:
        try:
            out, _ = popen.communicate(timeout=PY_SPY_TIMEOUT)
        except subprocess.TimeoutExpired:
            popen.kill()
            out, _ = popen.communicate()
        text = out.decode("utf-8", "replace")
        if worker.log is not None and not worker.log.closed:
            with contextlib.suppress(OSError, ValueError):
                worker.log.write(f"py-spy dump of pid {worker.pid}:\n{text}".encode())
                worker.log.flush()
        announce(f"py-spy stacks of {worker.label} written to {worker.spec.log or 'nowhere (no log file)'}")
