"""A preload list that learns: installed modules the ranks import beyond ``preload:``, for the warm parent.

The ranks write what they imported from installed locations (``launchers.elastic.ipc.import_report``);
this side reads those reports at most once a second, keeps the modules the warm parent has
not imported yet, and drops any whose file lies in the job's own directories (its code dir,
the start file's directory, the working directory) unless it sits in a site-packages
directory there (a virtual environment inside the code dir): a module of the job's own code
may read the rank's environment when imported, and a standby does not have that yet.

What the warm parent imported is said once (the roots: ``torch._dynamo``, not the hundreds of
modules it pulls in), so a user can also write them into ``preload:``.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from launchers.elastic.ipc import import_report
from launchers.elastic.ranks import env

READ_EVERY = 1.0  # seconds between two reads of the ranks' reports
SHOWN = 6  # names a message lists before "+ N more"


def report_files(run_id: str) -> list[str]:
    shm = env.shm_dir()
    pattern = f"mlaunch.{glob.escape(run_id)}.progress.*{import_report.SUFFIX}"
    return sorted(glob.glob(os.path.join(glob.escape(shm), pattern)))


def from_job_code(origin: str, job_dirs: Iterable[str]) -> bool:
    """Whether ``origin`` is a file of the job's own code (not an installed package inside its directory)."""
    if not os.path.isabs(origin):
        return False
    parts = origin.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return any(origin.startswith(os.path.join(d, "")) for d in job_dirs if d)


def listing(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" (+ {len(names) - SHOWN} more)" if len(names) > SHOWN else "")


class PreloadLearner:
    """Which modules to teach the warm parent next, and what to tell the user once."""

    def __init__(self, run_id: str, announce: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.announce = announce
        self.learned: list[str] = []  # modules the warm parent imported because the ranks did (roots)
        self.refused: set[str] = set()  # a learned module that made forking unsafe: never again
        self.stopped = False  # after a refusal: what made it unsafe may come with any later import too
        self.guessed: list[str] = []  # what the start file imports, for the warm parent before any rank ran
        self._asked: set[str] = set()  # sent to a warm parent once: not again (it imported or skipped it)
        self._said_skipped: set[str] = set()  # modules the warm parent skipped, said once each
        self._cache: dict[str, tuple[int, int, list[tuple[str, str]]]] = {}
        self._next_read = 0.0

    def reported(self) -> list[tuple[str, str]]:
        """Every (module, origin) the ranks reported, first seen first (files re-read only when changed)."""
        seen: dict[str, str] = {}
        for path in report_files(self.run_id):
            try:
                stat = os.stat(path)
            except OSError:
                continue
            cached = self._cache.get(path)
            if cached is None or cached[:2] != (stat.st_mtime_ns, stat.st_size):
                cached = (stat.st_mtime_ns, stat.st_size, import_report.read(path))
                self._cache[path] = cached
            for name, origin in cached[2]:
                seen.setdefault(name, origin)
        return list(seen.items())

    def new_modules(self, known: set[str], job_dirs: Iterable[str], now: float | None = None) -> list[str]:
        """Modules to import in a warm parent that has ``known``; empty until ``READ_EVERY`` has passed."""
        now = time.monotonic() if now is None else now
        if self.stopped:
            return []
        if now < self._next_read:
            return []
        self._next_read = now + READ_EVERY
        dirs = [os.path.realpath(d) for d in job_dirs] + list(job_dirs)
        wanted = [
            name
            for name, origin in self.reported()
            if name not in known
            and name not in self._asked
            and not any(name == r or name.startswith(r + ".") for r in self.refused)
            and not from_job_code(origin, dirs)
        ]
        self._asked.update(wanted)
        return wanted

    def guess(self, modules: list[str]) -> None:
        """Start from what the start file imports (``start_file_imports``): taught before the first attempt."""
        self.guessed = list(modules)  # ``take_guess`` leaves out what was asked for already

    def take_guess(self, known: set[str]) -> list[str]:
        """The guessed modules a warm parent with ``known`` still lacks, once (learning stopped: none)."""
        wanted = [m for m in self.guessed if m not in known and m not in self._asked and not self.stopped]
        self._asked.update(wanted)
        return wanted

    def imported(self, reply: dict[str, Any]) -> None:
        """The warm parent's answer to an ``import``: remember it and say, in one line and once, what changed."""
        added = [str(name) for name in reply.get("imported", [])]
        new = [name for name in added if name not in self.learned]
        self.learned.extend(new)
        skipped = {str(k): str(v) for k, v in (reply.get("skipped") or {}).items() if k not in self._said_skipped}
        self._said_skipped.update(skipped)
        parts = []
        seen = [name for name in new if name not in self.guessed]
        read = [name for name in new if name in self.guessed]
        count = int(reply.get("count") or 0)
        if read:
            parts.append(
                f"the start file imports {listing(read)}: the warm parent imported "
                f"{'it' if len(read) == 1 else 'them'} ({count} modules) before the first ranks, forked from it"
            )
        if seen:
            parts.append(
                f"the ranks also import {listing(seen)}: the warm parent imported "
                f"{'it' if len(seen) == 1 else 'them'} ({count} modules) for the next standbys"
            )
        if skipped:
            names = sorted(skipped)
            parts.append(f"not preloading {listing(names)}, which the ranks import: {skipped[names[0]]}")
        if parts:
            self.announce("preload: " + "; ".join(parts) + " (preload_learning: false turns learning off)")

    def refuse(self, module: str, why: str) -> None:
        """A learned module made the warm parent unsafe to fork: it restarts without it and learns no more.

        Learning stops: the hazard is often not the module named but what its import pulled in (a
        package that starts threads), which the next module learned would pull in again — each
        time a warm parent started afresh for nothing.
        """
        self.refused.add(module)
        self.stopped = True
        if module in self.learned:
            self.learned.remove(module)
        self.announce(
            f"preload: not preloading {module}, which the ranks import: {why}; the warm parent restarts without it "
            "and learns no more this run"
        )
