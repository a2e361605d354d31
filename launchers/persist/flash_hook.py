"""The agent-side flash save of one attempt, as the runner and the supervisor call it.

The supervisor calls it when a worker fails (``__call__``) and reserves the end of the grace
period for it (``reserve``); the runner calls ``after_stop`` when a stop signal ended the
attempt and ``checkpoint_dirs`` to know where the attempt's ranks checkpoint.

When ranks recover in place (``in_place()``: the supervisor kept survivors), the step is decided
while they are frozen and its write and commit run beside the recovery (``persist.commit_beside``):
the re-formed group reads it from memory and never waits for the disk. A flash save that follows
(a second fault, a stop) waits for that commit first: commits stay in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from launchers.config.job import Job
from launchers.elastic.ipc import staging
from launchers.log import say
from launchers.outcome import Failure, Outcome
from launchers.phases import long_phase
from launchers.plan import LaunchPlan

if TYPE_CHECKING:
    from launchers.control import Exchange
    from launchers.persist.commit_beside import CommitBeside
    from launchers.persist.flash_save import FlashResult


class FlashHook:
    """The agent-side flash save of one attempt (see ``launchers.persist.flash_save``)."""

    def __init__(
        self,
        run_id: str,
        attempt: int,
        plan: LaunchPlan,
        grace: float,
        exchange: Exchange | None = None,
        quiesce: Callable[[], None] | None = None,
        on_commit: Callable[[int, str], None] | None = None,
        on_failed: Callable[[str, int | None, str], None] | None = None,
        beside: CommitBeside | None = None,
    ) -> None:
        from launchers.persist import flash_save  # noqa: F401 - imported now, not on the first fault's way

        self.run_id = run_id
        self.beside = beside  # the run's commit beside an in-place recovery (None: every commit is on the path)
        self.in_place: Callable[[], bool] = lambda: False  # survivors were kept: the commit may run beside them
        self.on_commit = on_commit  # the status view, events.jsonl and goodput: the ranks never report this commit
        self.on_failed = on_failed  # a save that failed (a full disk...): counted in the status view and events.jsonl
        self.quiesce = quiesce  # stops the background persist (persist_every) before the dying save
        self.exchange = exchange  # the control plane's, when other nodes' mlaunch save their own ranks
        self.attempt = attempt
        self.grace = grace
        self.nnodes = plan.nnodes
        self.key = f"a{attempt}p{plan.master_port}"
        self.rank_nodes = {
            proc.rank: node.index
            for node in plan.nodes
            for proc in node.processes
            if proc.role == "worker" and proc.rank >= 0
        }
        self.done = False

    def __call__(self, failure: Failure) -> str | None:
        """A worker failed: persist the newest step every rank staged, while the others wind down.

        Once that step is committed — by this save, or before it (``skipped``: the background
        persist got there first) — the other workers have nothing newer to save (in synchronous
        training none of them can get past the failed rank's step), so the supervisor need not
        wait out their grace period: the returned reason says so.
        """
        result = self.persist(
            time.monotonic() + max(self.grace, 5.0), f"after {failure.label} failed", beside=self.in_place()
        )
        if result is not None and result.status == "pending":
            return f"step {result.step} is the newest every rank staged; it is committed beside the recovery"
        if result is not None and result.status in ("committed", "written"):  # written: node 0 commits it
            return f"step {result.step} is {result.status} for every rank"
        if result is not None and result.status == "skipped":  # the newest step every rank staged
            return f"step {result.step}, the newest every rank staged, was already committed"
        return None

    def after_stop(self, outcome: Outcome) -> None:
        """Stopped by a signal: persist what the workers did not commit, within the grace period.

        Workers that exited without committing (or had to be SIGKILLed at the end of their
        share, see ``reserve``) leave their staged step; past the grace period itself the
        platform's SIGKILL is due, so no write starts then.
        """
        if self.done or outcome.stop_started is None:
            return
        deadline = outcome.stop_started + self.grace
        if time.monotonic() < deadline:
            self.persist(deadline, "after the stop")

    def reserve(self) -> float:
        """Seconds to keep at the end of the grace period for persisting the staged state.

        An estimate of the persist: the bytes this node's ranks staged at the write speed
        their own saves showed (200 MB/s if none was measured), 1.5× plus half a second.
        0 when nothing is staged (then the workers get the whole grace period).
        """
        from launchers.persist.grace_budget import ASSUMED_BANDWIDTH

        infos = [i for i in staging.read_run(self.run_id) if i.rank in self.rank_nodes]
        staged = sum(max((s.length for s in i.slots if s.complete), default=0) for i in infos)
        if not staged:
            return 0.0
        speeds = [i.status.save_bytes / i.status.save_seconds for i in infos if i.status.save_seconds > 0]
        speed = min(speeds) if speeds else ASSUMED_BANDWIDTH
        return 0.5 + 1.5 * staged / max(speed, 1e6)

    def persist(self, deadline: float, when: str, beside: bool = False) -> FlashResult | None:
        """The flash save; ``beside``: decide the step now, write and commit it in ``self.beside``'s thread."""
        from launchers.persist.flash_save import FlashResult, decide

        if self.beside is not None:  # a commit beside an earlier recovery comes first (commits stay in order)
            self.beside.wait(f"a flash save {when}")
        if not self.rank_nodes or (not staging.run_segments(self.run_id) and self.exchange is None):
            return None
        self.done = True
        if self.quiesce is not None:  # a background persist in flight must not race this one
            self.quiesce()
        with long_phase(f"saving the dying checkpoint {when}"):
            decided = decide(
                self.run_id,
                attempt=self.attempt,
                rank_nodes=self.rank_nodes,
                nnodes=self.nnodes,
                key=self.key,
                deadline=deadline,
                exchange=self.exchange,
            )
            if not isinstance(decided, FlashResult) and beside and self.beside is not None:
                self.beside.start(decided, when, self.attempt)
                say(
                    f"flash save {when}: step {decided.step}, the newest every rank staged; the ranks resume from "
                    "it in memory, its commit runs beside the recovery"
                )
                return FlashResult("pending", "committing beside the recovery", decided.step)
            result = decided if isinstance(decided, FlashResult) else decided.write()
        if result.status not in ("skipped", "unstaged"):  # "nothing": ranks staged, yet no step can be saved: say why
            where = f" ({result.path})" if result.path else ""
            say(f"flash save {when}: {result.message}{where}")
        if result.status == "failed" and self.on_failed is not None:
            self.on_failed("flash", result.step, result.message)
        if result.status in ("committed", "written") and result.step is not None and self.on_commit is not None:
            self.on_commit(result.step, "flash")  # written: this node's shards, node 0 commits them for all
        return result

    def checkpoint_dirs(self, job: Job) -> set[str]:
        """Where this attempt's ranks checkpoint: job.yaml's dir and whatever their Checkpointers named."""
        roots = {str(job.resolve(job.checkpoint.dir))}
        roots.update(info.ckpt_dir for info in staging.read_run(self.run_id) if info.ckpt_dir)
        return roots
