"""The flash save's write and commit beside an in-place recovery: the re-formed group never waits for the disk.

After a peer's failure the surviving ranks (``@elastic.recoverable``) and the failed rank's
replacement resume from the newest step every rank staged, read from the memory mlaunch kept
(``ipc.kept_segments``). Writing that step to the checkpoint directory (every shard fsynced, the
marker, the rename) takes as long as the disk takes — on a GPU machine with a GiB per rank, a
second — and the ranks need none of it to go on. So when ranks recover in place the flash save
decides the step while they are frozen (``flash_save.decide``: a look at the slots' headers and,
with several nodes, one exchange), says it in the pending record, wakes them, and writes and
commits in this thread while the next attempt forms and trains.

The thread begins writing once the next attempt has handed the survivors their ranks and started
the replacement (its supervisor's first tick, ``tick``), or ``START_WITHIN`` after the decision,
whichever is first. Started at once it slowed mlaunch's own way to the next attempt: the thread's
file calls and mlaunch's main thread took the interpreter lock from each other, and the end of the
failed attempt (its orphan sweep over /proc, the status file, the plan of the next attempt) took
15–20 ms instead of 5–10 on two cores. The step stays in the ranks' kept memory meanwhile, and
anything that needs the commit (``wait``: a second fault's flash save, a stop, the run's end)
starts it at once.

What stays as it was: the commit's protocol (shards fsynced, marker last, the atomic rename), so a
fault at any point leaves the step either committed whole or not at all; commits stay in order
(a later flash save, a stop's save and the end of the run wait for this one first,
``wait``); the segments it reads stay open in it and are unlinked by mlaunch only after it ended
(``attempt._release_shared_memory``), so a second fault during the commit neither loses nor tears
the step. A commit that fails is said as a failed flash save always was: the ranks have resumed
from the step in memory, and the checkpoint directory keeps its older step until their next save.

The thread never prints (the supervisor may fork while it runs): the supervisor loop's tick, or
``wait``, says its result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from launchers.elastic.ipc import kept_segments
from launchers.log import say

if TYPE_CHECKING:
    from launchers.persist.flash_save import Decided, FlashResult

START_WITHIN: Final = 0.25  # seconds from the decision to the write at the latest, had no next attempt begun


class CommitBeside:
    """At most one flash-save commit running beside the recovery, for the whole run (``RunContext.beside``)."""

    def __init__(self, run_id: str, on_commit: Callable[[int, str], None] | None = None) -> None:
        self.run_id = run_id
        self.on_commit = on_commit  # the status view, events.jsonl and goodput (as ``FlashHook.on_commit``)
        self._thread: threading.Thread | None = None
        self._decided: Decided | None = None
        self._result: FlashResult | None = None
        self._when = ""
        self._go = threading.Event()  # the write may begin (the next attempt started, or someone waits)
        self.attempt = -1  # the attempt whose segments the commit reads
        self.waited = 0.0  # seconds mlaunch waited for commits at their release (a second fault, the run's end)

    def start(self, decided: Decided, when: str, attempt: int) -> None:
        """Say the step in the pending record, then write and commit it in a thread; returns at once."""
        self.wait()  # one at a time, in order (the caller waited already; this is the guarantee)
        kept_segments.announce_pending(self.run_id, _record(decided, attempt, kept_segments.PENDING))
        self._decided, self._result, self._when, self.attempt = decided, None, when, attempt
        self._go = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlaunch-commit-beside", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A commit is under way (its segments must stay)."""
        return self._thread is not None and self._thread.is_alive()

    def tick(self, attempt: int) -> None:
        """From ``attempt``'s supervisor loop: a later attempt started its ranks, so the write may begin; say a
        commit that ended."""
        if attempt > self.attempt:
            self._go.set()
        if self._thread is not None and not self._thread.is_alive():
            self._finish()

    def wait(self, why: str = "") -> None:
        """Until the commit under way ended (it has its own deadline), then say how it ended."""
        thread = self._thread
        if thread is None:
            return
        if thread.is_alive():
            began = time.monotonic()
            if why:
                say(f"waiting for the flash save's commit of step {self._step()} beside the recovery ({why})")
            self._go.set()
            thread.join()
            self.waited += time.monotonic() - began
        self._finish()

    def release(self, attempt: int) -> None:
        """The kept segments of the attempts before ``attempt`` are to go: a commit reading them ends first.

        Its pending record goes with them (nothing is left to read the pending step from).
        """
        if self.attempt < 0 or self.attempt >= attempt:
            return
        self.wait("its kept segments are released after it")
        kept_segments.ended(self.run_id)
        self.attempt = -1

    def _step(self) -> int | None:
        return self._decided.step if self._decided is not None else None

    def _run(self) -> None:
        decided = self._decided
        assert decided is not None
        self._go.wait(START_WITHIN)  # the next attempt's start first (see the module's docstring)
        result = decided.write()
        state = kept_segments.COMMITTED if result.status in ("committed", "written") else kept_segments.FAILED
        try:
            kept_segments.announce_pending(self.run_id, _record(decided, self.attempt, state))
        except OSError:
            kept_segments.ended(self.run_id)  # no record: a waiting rank reads the directory as it is
        self._result = result

    def _finish(self) -> None:
        """The ended commit, said once (log, status view, events)."""
        self._thread = None
        result = self._result
        if result is None:
            return
        self._result = None
        where = f" ({result.path})" if result.path else ""
        say(f"flash save {self._when}, beside the recovery: {result.message}{where}")
        if result.status in ("committed", "written") and result.step is not None and self.on_commit is not None:
            self.on_commit(result.step, "flash")


def _record(decided: Decided, attempt: int, state: str) -> dict[str, object]:
    return {
        "state": state,
        "step": decided.step,
        "dir": str(decided.root),
        "tmp": decided.tmp.name,
        "manifest": decided.manifest(),
        "attempt": attempt,
        "deadline": decided.share.deadline + 5.0,  # CLOCK_MONOTONIC: one clock for every process of the machine
    }
