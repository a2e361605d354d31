"""What the framework integrations share: the stop flag, per-step staging, the newest commit, a clean finish.

A ``Session`` is one rank's link to mlaunch:

- ``install()`` puts mlaunch's SIGTERM flag in place (again, when a framework replaced it:
  Lightning's ``fit()`` installs a handler that runs a collective inside the signal handler);
- ``stage(step, state)`` copies the state of a finished step to shared memory, where mlaunch's
  agent finds it after a kill -9 (``Checkpointer.stage``); ``should_stop(step)`` is the agreement
  (every rank, same step, one all-reduce);
- ``newer_commit(step)`` is mlaunch's newest committed step when it is newer than ``step`` (the
  framework's own newest checkpoint), with this rank's state of it — what an integration turns into
  a native checkpoint before the framework looks for one;
- ``finished()`` tells mlaunch this rank completed (nothing staged is persisted any more, and an
  abort in interpreter teardown is reported as such) and ends the process group at exit;
- ``stop()`` leaves the process with 143 after the framework's own save (``Guard.exit``).

Outside mlaunch (no ``MLAUNCH_RUN_ID``) staging is skipped and nothing is materialised; the stop
flag still works (a plain SIGTERM then saves and stops the same way).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launchers.elastic import guard as guard_mod
from launchers.elastic.checkpoint import Checkpointer
from launchers.elastic.format import layout, shardfile
from launchers.elastic.ipc import completion, rank_segment
from launchers.elastic.ranks import collective, env

_WAIT = 600.0  # how long a rank waits for rank 0 to write a native checkpoint


class Session:
    """One rank's link to mlaunch for a framework integration (see the module's docstring)."""

    def __init__(self, *, trusted: bool = False) -> None:
        self.under_mlaunch = bool(env.run_id())
        self.ckpt = Checkpointer(trusted=trusted)
        self.guard: guard_mod.Guard | None = None
        self.stop_step: int | None = None
        self.stage_seconds = 0.0  # time spent staging (the benchmark's overhead figure)
        self.staged_steps = 0
        self._finished = False

    # -- signals -----------------------------------------------------------------------
    def install(self) -> guard_mod.Guard:
        """mlaunch's stop flag for SIGTERM/SIGINT/SIGUSR1, re-installed if something replaced it."""
        guard = guard_mod.install(quiet=False)
        for sig in guard.signals:
            if signal.getsignal(sig) != guard._handler:
                signal.signal(sig, guard._handler)  # a framework wrapped or replaced ours
        self.guard = guard
        return guard

    def should_stop(self, step: int) -> bool:
        """True on every rank at the same step once any rank was signalled (collective)."""
        guard = self.guard or self.install()
        if guard.should_stop(step):
            if self.stop_step is None:
                self.stop_step = step
            return True
        return False

    def stop(self) -> None:
        """After the framework saved the agreed step: tell mlaunch, end the group, exit 143."""
        step = self.stop_step if self.stop_step is not None else -1
        rank_segment.update_status(*rank_world(), committed_step=step)
        collective.say(f"stopped at step {step}, saved in the framework's own format; exiting with 143")
        (self.guard or self.install()).exit()

    # -- staging -----------------------------------------------------------------------
    def wants_stage(self) -> bool:
        return self.under_mlaunch and not self._finished

    def stage(self, step: int, state: Any) -> None:
        """Stage ``state`` (the state after ``step``) for mlaunch's flash save."""
        self.stage_built(step, lambda: state)

    def stage_built(self, step: int, build: Callable[[], Any]) -> None:
        """Stage the state ``build()`` returns; ``stage_seconds`` counts building it too."""
        if not self.wants_stage():
            return
        started = time.perf_counter()
        self.ckpt.stage(step, build())
        self.stage_seconds += time.perf_counter() - started
        self.staged_steps += 1

    # -- resume ------------------------------------------------------------------------
    def newer_commit(self, native_step: int | None) -> tuple[int, Any] | None:
        """mlaunch's newest committed step newer than ``native_step`` and this rank's state of it."""
        if not self.under_mlaunch:
            return None
        rank, world = rank_world()
        for item in self.ckpt.committed():
            if native_step is not None and item.step <= native_step:
                return None
            if item.world_size != world or str(rank) not in item.manifest["shards"]:
                continue
            try:
                state, _meta = shardfile.read_file(item.shard(rank), trusted=self.ckpt.trusted)
            except (OSError, ValueError) as exc:
                collective.say(f"cannot read mlaunch's step {item.step} ({exc}); trying an older one")
                continue
            return item.step, state
        return None

    def every_rank(self, step: int, own: Any) -> list[Any]:
        """Every rank's staged state of the committed ``step``, by rank, ``own`` (this rank's, already read)
        in its place: what rank 0 needs of the others (their RNG states, their share of a sum)."""
        item = next(c for c in self.ckpt.committed() if c.step == step)
        rank = rank_world()[0]
        read = shardfile.read_file
        return [own if r == rank else read(item.shard(r), trusted=self.ckpt.trusted)[0] for r in range(item.world_size)]

    # -- the end -----------------------------------------------------------------------
    def finished(self) -> None:
        """This rank completed training: nothing staged is persisted any more; the group ends at exit."""
        if self._finished:
            return
        self._finished = True
        rank, world = rank_world()
        rank_segment.forget(rank, world)
        completion.mark_finished(rank)
        atexit.register(end_process_group)


def rank_world() -> tuple[int, int]:
    coll = collective.current()
    return coll.rank(), coll.world_size()


def end_process_group() -> None:
    """``destroy_process_group`` if one is up (torch's own teardown at exit sometimes aborts)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    with contextlib.suppress(Exception):
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def barrier() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()


def write_once(
    target: Path, step: int, write: Callable[[Path], None], *, every_rank: bool = False, directory: bool = True
) -> None:
    """Write a native checkpoint ``target`` through ``write(tmp)``, then rename it into place.

    Rank 0 writes (with ``every_rank``, every rank writes its own files into the same ``tmp``:
    needs a process group). The others wait for it: with a group at a barrier, without one for a
    small file next to the target that names the step, written after the rename.
    """
    rank, world = rank_world()
    tmp = target.parent / f".{target.name}.mlaunch-tmp"
    done = target.parent / f".{target.name}.mlaunch-{os.environ.get('MLAUNCH_RUN_ID', 'run')}-{step}"
    grouped = collective.current().name != "local" and world > 1
    if rank == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{target.name}.mlaunch-*"):
            _remove(stale)
        if directory:
            tmp.mkdir()
    if every_rank and grouped:
        barrier()
        write(tmp)
        barrier()
    elif rank == 0:
        write(tmp)
    if rank == 0:
        _remove(target)
        os.replace(tmp, target)
        if not grouped and world > 1:
            done.write_text(f"{step}\n")  # removed by the next attempt's write (see below)
    if grouped:
        barrier()
    elif world > 1 and rank != 0:
        wait_for(done, f"rank 0 to write {target}")


def _remove(path: Path) -> None:
    if path.is_dir():
        layout.remove_tree(path)
    else:
        path.unlink(missing_ok=True)


def wait_for(path: Path, what: str, timeout: float = _WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(0.02)
