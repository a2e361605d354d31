"""``Checkpointer``: atomic multi-rank save, newest-committed resume, staging for the agent.

``save(step, state)`` is collective when a process group is up (every rank calls it at the
same step, as after ``should_stop``):

1. rank 0 prepares ``step_N.tmp/`` (a stale partial directory of that name is removed first);
   an all-reduce tells every rank to go on (or that step N is already committed);
2. every rank writes its shard and fsyncs it;
3. an all-gather of (ok, size): rank 0 commits only if every rank wrote (marker last, see
   ``layout``); a failure anywhere (disk full...) fails the save on every rank alike, so no
   rank hangs waiting for one that gave up;
4. an all-reduce of rank 0's result: everyone returns, or everyone raises ``CheckpointError``.

Without a process group but with several ranks (``RANK``/``WORLD_SIZE`` set, no collective), rank 0 commits
once every rank's shard and ``.done`` file is there, as DLRover's agents do.

``load_latest()`` returns this rank's state from the newest committed step (all ranks agree
on the step when a group is up), or None. Loading runs no code: a shard's header is JSON and a
state holds plain data, unless the ``Checkpointer`` is created with ``trusted=True`` (then any
picklable object can be saved, and is unpickled on load). ``stage(step, state)`` copies the state into this
rank's shared-memory segment so mlaunch can persist it if the process dies.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.elastic import ddp_layouts, resume
from launchers.elastic.errors import CheckpointError as CheckpointError
from launchers.elastic.format import layout, plain, shardfile
from launchers.elastic.ipc import commit_tail, progress, rank_segment
from launchers.elastic.ranks import collective, env
from launchers.elastic.storage import durable

DEFAULT_DIR = "output/ckpt"
DEFAULT_KEEP = env.DEFAULT_KEEP
_DONE_WAIT = 600.0


Writer = Callable[[Path], int]

# step 1's verdict, reduced with MAX over the ranks: the worst one wins
_GO, _ALREADY_COMMITTED, _CANNOT_PREPARE = 0, 1, 2


@dataclass(frozen=True)
class _Save:
    """One call of ``save``: the step, this rank, where the step goes and how ranks agree."""

    coll: collective.Collective
    step: int
    ext: str
    rank: int
    world: int
    final: Path  # step_N/
    tmp: Path  # step_N.tmp/, renamed to ``final`` after the commit

    @property
    def grouped(self) -> bool:
        """A process group is up: ranks agree through collectives (otherwise through files)."""
        return self.coll.name != "local" and self.world > 1


class Checkpointer:
    """Checkpoints of one job in ``dir`` (default ``$MLAUNCH_CHECKPOINT_DIR``, else ``output/ckpt``)."""

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        keep: int | None = None,
        replicas: Sequence[int] | None = None,
        trusted: bool = False,
        on_unreadable: str | None = None,
        stage_overlap: bool = False,
    ) -> None:
        chosen = dir if dir is not None else os.environ.get("MLAUNCH_CHECKPOINT_DIR") or DEFAULT_DIR
        self.dir = Path(chosen).expanduser().absolute()
        if keep is None:
            keep = env.checkpoint_keep()
        if keep < 1:
            raise ValueError(f"keep must be ≥ 1, got {keep}")
        self.keep = keep
        # ranks holding the same state as this one (a replica group): a dying checkpoint
        # written by one member per group still resumes every member
        self.replicas = list(replicas or [])
        # trusted=True: save any picklable object and unpickle it on load, which runs code the
        # checkpoint chose — only for directories nobody else can write (see shardfile)
        self.trusted = trusted
        # committed steps exist but none can be loaded: "fail" (raise on every rank) or "start_over"
        # (train from scratch, loudly); default: job.yaml's checkpoint.on_unreadable via mlaunch's env
        chosen_policy = on_unreadable or os.environ.get(resume.ON_UNREADABLE_ENV) or "fail"
        if chosen_policy not in ("fail", "start_over"):
            raise ValueError(f"on_unreadable must be 'fail' or 'start_over', got {chosen_policy!r}")
        self.on_unreadable = chosen_policy
        # accelerator state: stage() queues its copy to pinned memory and returns; the compute stream waits for
        # the copy before its next kernel, or — stage_overlap=True — only at the next optimizer.step(), so the
        # copy overlaps the next forward and backward (for states nothing else changes in place before the
        # optimizer step; BatchNorm's running statistics in train mode do). See ipc.device_stage.
        self.stage_overlap = stage_overlap
        self._fresh = f"fresh-{env.run_id()[:12]}-{uuid.uuid4().hex[:12]}"
        self.loaded: layout.Committed | None = None  # what load_latest() resumed from
        self.last_saved: Path | None = None

    # -- who am I ----------------------------------------------------------------------
    @staticmethod
    def _coll() -> collective.Collective:
        return collective.current()

    # -- resume ------------------------------------------------------------------------
    def committed(self) -> list[layout.Committed]:
        """Committed checkpoints, newest first."""
        return layout.committed(self.dir)

    def load_latest(self, into: Any = None) -> Any | None:
        """Resume from the newest committed checkpoint; None when there is none (fresh start).

        Without ``into``: this rank's state as it saved it (the job's world size must be the one
        that saved it). With ``into`` (e.g. ``{"model": msd, "optim": osd, ...}`` from
        ``get_state_dict(model, optimizer)``): its tensors and DTensors are filled in place and
        its plain values replaced, whatever world size or mesh saved the checkpoint — each rank
        reads only the pieces its shards need (DCP's planner decides which) — and the step is
        returned. Collective when a process group is up. Uncommitted directories are ignored
        (and, on rank 0, removed); if a rank cannot read the newest step, every rank falls back
        to an older one together. A checkpoint that would need ``trusted=True``, or that does not
        match ``into``, raises ``CheckpointError`` on every rank instead (see ``resume``).
        """
        return resume.load_latest(self, into)

    def latest_shard(self) -> Path | None:
        """This rank's file in the newest committed checkpoint (for frameworks that load it themselves).

        Falls back to a replica's file (``replicas``), then to older checkpoints; None when
        there is nothing to resume from. Not collective.
        """
        rank, world = self._coll().rank(), self._coll().world_size()
        ahead = resume.committing(self)  # a step committed beside an in-place recovery: its file, once there
        if ahead is not None:
            ahead.wait()
        if rank == 0:
            layout.clean_partial(self.dir)
        for item in self.committed():
            if item.world_size != world:
                continue
            for source in [rank, *[r for r in self.replicas if r != rank]]:
                if str(source) in item.manifest["shards"] and item.shard(source).exists():
                    self.loaded = item
                    return item.shard(source)
        return None

    @property
    def loaded_step(self) -> int | None:
        return self.loaded.step if self.loaded else None

    # -- stage -------------------------------------------------------------------------
    def stage(self, step: int, state: Any) -> bool:
        """Copy ``state`` to shared memory for mlaunch's agent-side save; False when not staged.

        Not collective and cheap (one memcpy of the tensors). Tensors on an accelerator are
        copied to pinned memory on a side stream and published to the slot when the copy is done
        (``ipc.device_stage``): the call waits only for the previous step's copy, if still going.
        It is a no-op outside mlaunch (nobody would read it) and after a failure to reserve
        shared memory (warned once).
        """
        progress.report(step)  # hang detection (monitor.hang_timeout)
        started = time.monotonic()
        try:
            return self._stage(step, state)
        finally:
            progress.saved(time.monotonic() - started, None)

    def _stage(self, step: int, state: Any) -> bool:
        coll = self._coll()
        rank, world = coll.rank(), coll.world_size()
        if rank_segment.process_segment(rank, world) is None:
            return False  # not under mlaunch, or staging is off: encode nothing
        try:
            enc = shardfile.encode(state, self._meta(step, rank, world, "stage"), trusted=self.trusted, on_device=True)
        except plain.UnsafeState as exc:  # a value the format cannot hold safely: the user's to fix
            raise CheckpointError(f"cannot stage step {step}: {exc}") from None
        if not commit_tail.stage_image(rank, world, self.dir, self.keep, step, enc, overlap=self.stage_overlap):
            return False
        rank_segment.update_status(rank, world, state_bytes=enc.size)
        return True

    # -- save --------------------------------------------------------------------------
    def save(self, step: int, state: Any, *, writer: Writer | None = None, ext: str = ".mlck") -> Path:
        """Write this rank's shard of ``step`` and commit once every rank has; returns the directory.

        Collective: every rank calls it with the same step. ``writer`` (another framework's
        own serialiser, e.g. ``mindspore.save_checkpoint``) writes the shard file itself, named
        ``rank_<R><ext>``, and returns its size; ``latest_shard()`` finds it again.
        Raises ``CheckpointError`` on every rank when any rank failed; nothing is committed then.
        """
        coll = self._coll()
        name = layout.step_name(step)
        job = _Save(coll, step, ext, coll.rank(), coll.world_size(), self.dir / name, self.dir / (name + ".tmp"))
        started = time.monotonic()
        rank_segment.update_status(job.rank, job.world, saving_step=step)
        if not self._agree_to_start(job):
            return job.final
        error, size = self._write_shard(job, state, writer)
        committed_path = self._commit_everywhere(job, error, size)
        return self._finish(job, committed_path, size, started)

    def _agree_to_start(self, job: _Save) -> bool:
        """Step 1: rank 0 prepares ``step_N.tmp/``; False when step N is already committed."""
        verdict = _GO
        if job.rank == 0 or not job.grouped:
            verdict = self._prepare(job.final, job.tmp, clean=job.rank == 0 and (job.grouped or job.world == 1))
        if job.grouped:
            verdict = job.coll.all_reduce([verdict], "max")[0]
        if verdict == _ALREADY_COMMITTED:
            collective.say(f"step {job.step} is already committed; not saving it again")
            return False
        if verdict == _CANNOT_PREPARE:
            raise CheckpointError(f"cannot create {job.tmp}")
        return True

    def _write_shard(self, job: _Save, state: Any, writer: Writer | None) -> tuple[Exception | None, int]:
        """Step 2: this rank's shard, written and fsynced (with its directory); (error, size).

        A failure (disk full, a state that is not plain data...) is returned, not raised, so that
        every rank still takes part in the agreement that follows; the partial shard is removed.
        """
        size = 0
        shard = job.tmp / layout.shard_name(job.rank, job.ext)
        try:
            job.tmp.mkdir(parents=True, exist_ok=True)
            if writer is not None:
                size = writer(shard)
                with open(shard, "rb+") as fh:
                    os.fsync(fh.fileno())
            else:
                meta = self._meta(job.step, job.rank, job.world, "save")
                size = shardfile.write_file(shard, shardfile.encode(state, meta, trusted=self.trusted))
            durable.fsync_dir(job.tmp)
        except (OSError, plain.UnsafeState) as exc:
            with contextlib.suppress(OSError):
                shard.unlink()
            return exc, size
        return None, size

    def _commit_everywhere(self, job: _Save, error: Exception | None, size: int) -> Path | None:
        """Step 3: rank 0 commits if every rank wrote; its directory (None on the other ranks).

        Raises ``CheckpointError`` on every rank alike when the step was not committed.
        """
        results = job.coll.all_gather([0 if error else 1, size]) if job.grouped else [[0 if error else 1, size]]
        failed = [r for r, (ok, _) in enumerate(results) if not ok]
        committed_path: Path | None = None
        commit_error: BaseException | None = None
        if job.rank == 0 and not failed:
            try:
                committed_path = self._commit(job, results, size)
            except (OSError, TimeoutError) as exc:
                commit_error = exc
        elif not job.grouped and not error and job.world > 1:
            with contextlib.suppress(OSError):
                self._write_done(job.tmp, job.rank, size)
        if not self._agree_committed(job, committed_path is not None, error):
            if job.rank == 0:
                layout.remove_tree(job.tmp)
            rank_segment.update_status(job.rank, job.world, saving_step=-1)
            why = error or commit_error or (f"rank(s) {failed} failed to write" if failed else "rank 0 did not commit")
            raise CheckpointError(f"checkpoint of step {job.step} was not committed: {why}")
        return committed_path

    def _commit(self, job: _Save, results: list[list[int]], size: int) -> Path:
        """Rank 0: the marker, written last, once every rank's shard is there (see ``layout.commit``).

        With a process group the sizes came with the all-gather; without one, rank 0 waits
        for every rank's ``.done`` file.
        """
        if job.grouped or job.world == 1:
            sizes = {r: s for r, (_, s) in enumerate(results)}
        else:
            self._write_done(job.tmp, job.rank, size)
            sizes = self._wait_done(job.tmp, job.world)
        lineage = self.lineage()
        return layout.commit(job.tmp, job.final, job.step, job.world, sizes, ext=job.ext, source="save", **lineage)

    @staticmethod
    def _agree_committed(job: _Save, committed: bool, error: Exception | None) -> bool:
        """Step 4: whether the step was committed, the same answer on every rank of a group."""
        if job.grouped:
            return bool(job.coll.all_reduce([1 if committed else 0], "max")[0])
        if job.rank != 0:
            return error is None  # rank 0 commits on its own; this rank did its part
        return committed

    def _finish(self, job: _Save, committed_path: Path | None, size: int, started: float) -> Path:
        """After the commit: rank 0 prunes to the newest ``keep``; status and the message (``commit_tail``)."""
        self.last_saved = committed_path or job.final
        seconds = time.monotonic() - started
        commit_tail.after_commit(
            self.dir,
            self.keep,
            job.step,
            rank=job.rank,
            world=job.world,
            coordinator=job.rank == 0,
            seconds=seconds,
            size=size,
            path=self.last_saved,
        )
        return self.last_saved

    def _prepare(self, final: Path, tmp: Path, *, clean: bool) -> int:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            step = layout.parse_step(final.name)
            there = [c for c in layout.committed(self.dir) if step is not None and c.step == step[0]]
            ours = self.lineage()
            if there and layout.same_lineage(there[0].manifest, ours["lineage"]):
                return _ALREADY_COMMITTED  # this line of training committed it (the agent, or an earlier save)
            if there and clean:
                collective.say(f"step {there[0].step} {_replacing(there[0], ours['resumed_step'])}")
            if clean:
                if tmp.exists():
                    layout.remove_tree(tmp)  # a stale partial save of this step: never reuse it
                if final.exists() and layout.read_marker(final) is None:
                    layout.remove_tree(final)  # a replaced commit stays until this one's marker is written
            tmp.mkdir(exist_ok=True)
            durable.fsync_dir(self.dir)
        except OSError as exc:
            collective.say(f"cannot prepare {tmp}: {exc}")
            return _CANNOT_PREPARE
        return _GO

    @staticmethod
    def _write_done(tmp: Path, rank: int, size: int) -> None:
        layout.write_json_atomic(tmp / f"rank_{rank}.done", {"rank": rank, "bytes": size})

    @staticmethod
    def _wait_done(tmp: Path, world: int) -> dict[int, int]:
        import json

        deadline = time.monotonic() + _DONE_WAIT
        sizes: dict[int, int] = {}
        while time.monotonic() < deadline:
            for r in range(world):
                if r not in sizes:
                    with contextlib.suppress(OSError, ValueError):
                        sizes[r] = int(json.loads((tmp / f"rank_{r}.done").read_text())["bytes"])
            if len(sizes) == world:
                for r in range(world):
                    with contextlib.suppress(OSError):
                        (tmp / f"rank_{r}.done").unlink()
                return sizes
            time.sleep(0.05)
        raise TimeoutError(f"not every rank finished its shard in {tmp}")

    def clear(self) -> None:
        """Remove every checkpoint of this directory and drop what was staged (collective).

        For a run that finished: nothing is left to resume, and mlaunch's agent must not
        persist the last staged step if a process dies while shutting down.
        """
        coll = self._coll()
        rank_segment.forget(coll.rank(), coll.world_size())
        if coll.rank() == 0:
            for item in self.committed():
                layout.remove_tree(item.path)
            layout.clean_partial(self.dir)
        if coll.name != "local" and coll.world_size() > 1:
            coll.all_reduce([0], "max")

    # -- helpers -----------------------------------------------------------------------
    def _meta(self, step: int, rank: int, world: int, how: str) -> dict[str, Any]:
        return {
            **{"step": step, "rank": rank, "world_size": world, "how": how, "attempt": env.attempt()},
            "resumed_from": self.loaded.id if self.loaded else None,
            **self.lineage(),
            **ddp_layouts.header(),  # DDP's gradient bucket layouts: a resume reduces as the run did (issue 48)
        }

    def lineage(self) -> dict[str, Any]:
        """The line of training this job's commits continue (``layout``): the commit it resumed from, or fresh."""
        if self.loaded is not None:
            return {"lineage": self.loaded.id or f"step-{self.loaded.step}", "resumed_step": self.loaded.step}
        return {"lineage": self._fresh, "resumed_step": -1}


def _replacing(old: layout.Committed, resumed_step: int) -> str:
    """Why a save replaces a committed step: it belongs to another line of training than the one this job continues."""
    before = old.resumed_step if old.resumed_step is not None else -1
    theirs = f"resumed from step {before}" if before >= 0 else "started from scratch"
    mine = f"resumed from step {resumed_step}" if resumed_step >= 0 else "started from scratch"
    return (
        f"was committed by another line of training (one that {theirs}); this job {mine}, so its own step "
        f"{old.step} replaces it (the old one is removed once the new one is committed)"
    )
