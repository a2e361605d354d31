"""A rank's "I finished training" report to mlaunch, next to its staging segment.

``mark_finished(rank)`` writes ``mlaunch.<run id>.finished.rank<R>`` (in the staging directory,
``/dev/shm``) holding the restart attempt. When every rank of the attempt has reported, mlaunch
treats the job as complete: a rank that then dies in interpreter teardown (torch's C++ teardown
aborting, SIGABRT) is reported as that, not restarted, and nothing staged is flash-saved.
Outside mlaunch (no ``MLAUNCH_RUN_ID``) this does nothing.
"""

from __future__ import annotations

import contextlib
import glob
import os

from launchers.elastic.ranks import env


def _path(run_id: str, rank: int) -> str:
    return os.path.join(env.shm_dir(), f"mlaunch.{run_id}.finished.rank{rank}")


def mark_finished(rank: int) -> None:
    run_id = env.run_id()
    if not run_id:
        return
    attempt = env.attempt()
    with contextlib.suppress(OSError), open(_path(run_id, rank), "w") as fh:
        fh.write(f"{attempt}\n")


def finished_ranks(run_id: str, attempt: int) -> set[int]:
    """The ranks that reported completion in ``attempt`` (mlaunch's side)."""
    found: set[int] = set()
    pattern = os.path.join(glob.escape(env.shm_dir()), f"mlaunch.{glob.escape(run_id)}.finished.rank*")
    for path in glob.glob(pattern):
        rank = path.rpartition(".rank")[2]
        try:
            with open(path) as fh:
                if int(fh.read().strip() or -1) == attempt and rank.isdigit():
                    found.add(int(rank))
        except (OSError, ValueError):
            continue
    return found


def clear(run_id: str) -> None:
    pattern = os.path.join(glob.escape(env.shm_dir()), f"mlaunch.{glob.escape(run_id)}.finished.rank*")
    for path in glob.glob(pattern):
        with contextlib.suppress(OSError):
            os.unlink(path)


def finished() -> None:
    """This rank's training is complete (``elastic.finished()``): call it after the last step and the last save.

    mlaunch then never restarts the job or flash-saves for this rank: if the process dies on its way
    out (torch's C++ teardown aborting), that is reported as a teardown abort and the job's exit
    code stays 0 when every rank finished.
    """
    rank = env.env_rank(0)
    mark_finished(rank)
