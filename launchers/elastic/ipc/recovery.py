"""In-place recovery: the per-process file through which a surviving rank and its mlaunch agree to go on.

A rank whose training function is wrapped in ``launchers.elastic.recoverable`` *declares* itself
recoverable: ``mlaunch.<run id>.recover.<pid>`` appears in the staging directory (``/dev/shm``).
When a peer fails (killed, hung, its rank on another node killed), mlaunch keeps such ranks alive
instead of stopping them, and writes into their file, by an atomic rename, in this order:

- ``hold`` (with the failed attempt): a recovery is under way; the rank, whose collective has just
  failed, waits for the next word instead of re-raising;
- ``go`` (with the next attempt and its environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``,
  ``MLAUNCH_RESTART_COUNT``...): the next attempt's group forms; the rank applies the environment
  and calls its training function again, in the same process.

Once declared, the file is mlaunch's alone to write: a rank's write could replace a newer word (a
``go`` written while the rank read the last one). What the rank says back goes into a file of its own,
``<file>.rank`` (``mark_joined``, ``mark_left``): the attempt it joined and the attempt whose call it left.

A rank that falls back (mlaunch restarts the whole job instead) is simply stopped: the file never
says ``go``. The rank side never waits for ``hold`` longer than its ``notice_within`` bound: an
exception no peer failure explains is the rank's own and is raised as before.

Both sides import this module (stdlib only). The files are removed when the rank exits and with
the run (``unlink_run``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from launchers.elastic.ranks import env

DECLARED, HOLD, GO = "declared", "hold", "go"


@dataclass(frozen=True)
class Word:
    """What the file says: its state, the attempt it is about, and (``go``) the next attempt's environment."""

    state: str
    attempt: int
    env: dict[str, str] = field(default_factory=dict)
    why: str = ""


def path_of(run_id: str, pid: int) -> str:
    return os.path.join(env.shm_dir(), f"mlaunch.{run_id}.recover.{pid}")


def _replace(path: str, text: str) -> None:
    """``path`` holds ``text``, whole or not at all (a temporary file renamed over it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _write(path: str, word: Word) -> None:
    _replace(path, json.dumps({"state": word.state, "attempt": word.attempt, "env": word.env, "why": word.why}))


def read(path: str) -> Word | None:
    try:
        with open(path) as fh:
            data: Any = json.load(fh)
        return Word(str(data["state"]), int(data["attempt"]), dict(data.get("env") or {}), str(data.get("why", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ----------------------------------------------------------------------------------------
# Rank side
# ----------------------------------------------------------------------------------------


_marks: dict[str, int] = {}  # this process's marks ("joined", "left"), written whole on each change
_declared_by: int | None = None  # the pid that declared (a forked child inherits this module's state)


def declare() -> bool:
    """This process recovers in place (``elastic.recoverable``); False outside mlaunch.

    Writes the file once per process: after that, mlaunch may have written a word into it, which this
    process must not replace (a call after a rejoin says so with ``mark_joined`` instead). A file already
    there at the first declaration is a dead process's of the same pid (a killed rank's stays until the
    run ends): replaced, with its marks.
    """
    global _declared_by
    run_id = env.run_id()
    if not run_id:
        return False
    path = path_of(run_id, os.getpid())
    if _declared_by == os.getpid() and os.path.exists(path):
        mark_joined()
        return True
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marks_path(path))
        _write(path, Word(DECLARED, env.attempt()))
    except OSError:
        return False
    _marks.clear()
    _declared_by = os.getpid()
    return True


def withdraw() -> None:
    """This process no longer recovers in place (its training function returned or gave up)."""
    global _declared_by
    run_id = env.run_id()
    if run_id:
        _marks.clear()
        _declared_by = None
        for path in (path_of(run_id, os.getpid()), marks_path(path_of(run_id, os.getpid()))):
            with contextlib.suppress(OSError):
                os.unlink(path)


def marks_path(path: str) -> str:
    """The rank's own file beside mlaunch's: the attempt it joined and the attempt whose call it left."""
    return f"{path}.rank"


def _mark(what: str) -> None:
    run_id = env.run_id()
    if not run_id:
        return
    _marks[what] = env.attempt()
    with contextlib.suppress(OSError):
        _replace(marks_path(path_of(run_id, os.getpid())), f"{_marks.get('joined', -1)} {_marks.get('left', -1)}")


def mark_joined() -> None:
    """This process took its ``go``: it is in the attempt it was told (mlaunch stops watching it as a survivor)."""
    _mark("joined")


def mark_left() -> None:
    """The failed call has returned: this process is out of every collective of the attempt it was in.

    mlaunch tells such a survivor, which may still wait for rank 0's new store, from one whose wait
    outlived its shut-down connections (``run.left_behind``).
    """
    _mark("left")


def await_go(notice_within: float, stop_requested: Any = None, poll: float = 0.002) -> Word | None:
    """After a failed collective: the next attempt's word, or None when no recovery is under way.

    Waits ``notice_within`` seconds for mlaunch to say ``hold`` (a peer failed); once it has, waits
    for ``go`` as long as it takes (mlaunch stops this process if the job restarts whole instead).
    ``stop_requested()`` true (a stop signal reached this rank) ends the wait: None.
    """
    run_id = env.run_id()
    if not run_id:
        return None
    path = path_of(run_id, os.getpid())
    mine = env.attempt()
    deadline = time.monotonic() + notice_within
    held = False
    while True:
        word = read(path)
        if word is not None and word.state == GO and word.attempt > mine:
            return word
        if word is not None and word.state == HOLD and word.attempt >= mine:
            held = True
        if stop_requested is not None and stop_requested():
            return None
        if not held and time.monotonic() >= deadline:
            return None
        time.sleep(poll)


# ----------------------------------------------------------------------------------------
# Agent side (mlaunch)
# ----------------------------------------------------------------------------------------


def marks_of(run_id: str, pid: int) -> tuple[int, int]:
    """(the attempt ``pid`` joined in place, the attempt whose call it last left); -1 for none of either."""
    try:
        with open(marks_path(path_of(run_id, pid))) as fh:
            joined, left = fh.read().split()
        return int(joined), int(left)
    except (OSError, ValueError):
        return -1, -1


def declared_pids(run_id: str) -> set[int]:
    """The processes of the run that recover in place (their file exists)."""
    pattern = os.path.join(glob.escape(env.shm_dir()), f"mlaunch.{glob.escape(run_id)}.recover.*")
    pids: set[int] = set()
    for path in glob.glob(pattern):
        tail = path.rpartition(".recover.")[2]
        if tail.isdigit():
            pids.add(int(tail))
    return pids


def hold(run_id: str, pid: int, attempt: int, why: str) -> bool:
    """Tell ``pid`` that a recovery of ``attempt`` is under way; False when it has no file (it cannot recover)."""
    path = path_of(run_id, pid)
    if not os.path.exists(path):
        return False
    try:
        _write(path, Word(HOLD, attempt, why=why))
    except OSError:
        return False
    return True


def go(run_id: str, pid: int, attempt: int, environment: dict[str, str]) -> bool:
    """Hand ``pid`` the environment of ``attempt``, which it joins in place; False when it cannot be told."""
    path = path_of(run_id, pid)
    if not os.path.exists(path):
        return False
    try:
        _write(path, Word(GO, attempt, dict(environment)))
    except OSError:
        return False
    return True


def forget(run_id: str, pid: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path_of(run_id, pid))


def unlink_run(run_id: str) -> None:
    pattern = os.path.join(glob.escape(env.shm_dir()), f"mlaunch.{glob.escape(run_id)}.recover.*")
    for path in glob.glob(pattern):
        with contextlib.suppress(OSError):
            os.unlink(path)
