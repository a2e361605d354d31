"""Warm standby workers for fast restarts, mlaunch's side (``launchers.standby.standby`` is the other).

Standbys are forked by a warm parent per interpreter (``launchers.standby.warm_parent``), which
imported ``preload:`` once and is kept across attempts; where forking is unsafe (a preload
module starts a thread or opens a device at import), or ``preload_fork: false``, each standby
is its own interpreter that imports the list itself, as before. With ``preload_learning``
the warm parent also imports what the ranks were seen to import beyond the list
(``launchers.standby.preload_learning``), and idle standbys forked before that are replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from launchers.elastic.ipc import staging
from launchers.log import say
from launchers.plan import ProcessSpec
from launchers.procs import become_subreaper, process_env, reap_unknown, start_process
from launchers.standby.device import DEVICE_ENV, DeviceSlot, device_slot
from launchers.standby.handoff import STORE_WAIT_SECONDS, launcher_state, store_to_wait_for
from launchers.standby.kept_standby import KeptStandby
from launchers.standby.proc_title import room_argument
from launchers.standby.start_file_imports import guess_for, job_dirs

if TYPE_CHECKING:
    from launchers.standby.preload_learning import PreloadLearner
    from launchers.standby.warm_parent_handle import WarmParent

WARM_START_WAIT = 30.0  # the most an attempt waits for the warm parent's imports before its ranks start cold


def common_env(specs: list[ProcessSpec]) -> dict[str, str]:
    """The variables every one of ``specs`` sets alike: the warm parent imports with these (no rank's own)."""
    if not specs:
        return {}
    shared = dict(specs[0].env)
    for spec in specs[1:]:
        shared = {k: v for k, v in shared.items() if spec.env.get(k) == v}
    return shared


def guessing_pays(specs: list[ProcessSpec]) -> bool:
    """Whether the first ranks may wait for the start file's imports in a warm parent: two or more share it
    (one gains nothing), and ``OMP_NUM_THREADS=1`` (the PyTorch engine's for several): otherwise torch and
    numpy start threads at import there, the import is refused, and the ranks would start cold after it."""
    return len(specs) >= 2 and process_env(common_env(specs), "").get("OMP_NUM_THREADS") == "1"


class Watched(Protocol):
    """The node's watchdog (``launchers.run.watchdog``), as far as standbys need it: no process outlives mlaunch."""

    def watch(self, pgid: int) -> None: ...
    def unwatch(self, pgid: int) -> None: ...


class StandbyPool:
    """Warm standby workers for fast restarts (see ``launchers.standby.standby`` for the other side).

    One standby per worker slot, in its own process group with the same parent-death
    signal, ``MLAUNCH_RUN_ID`` and watchdog registration as a worker. Importing torch takes
    seconds of CPU, so the warm parent (or, without one, each standby) starts importing only
    once the attempt's workers are past their own start-up: ``delay`` seconds after the
    attempt began *and* once a rank staged a step (``launchers.elastic``) or every worker
    wrote output — or after ``fallback`` seconds. Once a warm parent is up, forking is cheap
    and standbys are refilled at once. A restart hands each new worker to a standby when its
    start command is ``<python> -u script.py ...`` with the standby's interpreter; anything
    else starts cold.
    """

    def __init__(
        self,
        preload: list[str],
        *,
        run_id: str = "",
        watchdog: Watched | None = None,
        delay: float = 1.0,
        fork: bool = True,
        learn: bool = False,
        device: bool = False,
        announce: Callable[[str], None] = say,
    ) -> None:
        self.preload = list(preload)
        self.run_id = run_id
        self.watchdog = watchdog
        self.delay = delay
        self.announce = announce
        self.standbys: list[KeptStandby] = []
        self.handed_off = 0
        self.cold_starts = 0
        self.fallback = 30.0
        self._attempt_wall = time.time()
        self.fork = fork and become_subreaper()  # a forked standby must be adopted by mlaunch
        self.device = device  # ``preload_device``: each standby initialises CUDA for its slot's rank
        self.parents: dict[str, WarmParent] = {}  # interpreter → its warm parent
        self.learner: PreloadLearner | None = None
        if learn and run_id:
            from launchers.standby.preload_learning import PreloadLearner

            self.learner = PreloadLearner(run_id, announce)
        self._dirs: set[str] = set()

    @property
    def rank_env(self) -> dict[str, str]:
        """What every rank's environment gets from the pool: ask it for import reports when learning."""
        return {"MLAUNCH_REPORT_IMPORTS": "1"} if self.learner is not None and self.fork else {}

    def new_attempt(self) -> None:
        """An attempt starts now: refill only after its workers show progress."""
        self._attempt_wall = time.time()

    def may_fill(self, elapsed: float, all_spoke: bool = False) -> bool:
        """Whether the attempt's workers are past their start-up (see the class docstring)."""
        if elapsed >= self.fallback or not self.run_id:
            return True
        # With a warm parent up, forks cost milliseconds — but not in the restarted ranks' way: on 2 cores four
        # forks (and the new standbys' copy-on-write faults) during a restart cost it ~0.2 s before its first step.
        # So forks wait for a staged step too, though not for ``delay``: an own import costs seconds of CPU.
        forks = self.fork and bool(self.parents)
        if not forks and elapsed < self.delay:
            return False
        if self._staged_since_attempt():
            return True
        return all_spoke and elapsed >= self.delay

    def _staged_since_attempt(self) -> bool:
        return any(
            slot.complete and slot.stamp >= self._attempt_wall
            for info in staging.read_run(self.run_id)
            for slot in info.slots
        )

    @staticmethod
    def compatible(spec: ProcessSpec) -> bool:
        argv = spec.argv
        return len(argv) >= 3 and argv[1] == "-u" and argv[2].endswith(".py") and spec.role == "worker"

    def pids(self) -> set[int]:
        """Standbys and warm parents: mlaunch's children that are not this attempt's workers."""
        return {s.pid for s in self.standbys} | {p.pid for p in self.parents.values()}

    def _alive(self) -> list[KeptStandby]:
        self.standbys = [s for s in self.standbys if s.poll() != "dead"]
        return self.standbys

    def ready_message(self, wanted: int) -> str:
        """What the run says once its standbys are ready: how many, and how many hold their rank's GPU."""
        warmed = sum(1 for s in self._alive() if s.warmed)
        on_device = f" ({warmed} with CUDA initialised on their rank's device: preload_device)" if warmed else ""
        return f"{wanted} warm standby workers ready for a restart{on_device}"

    def slot(self, spec: ProcessSpec) -> DeviceSlot | None:
        """The device ``spec``'s rank will use, when standbys warm one (``preload_device``)."""
        if not self.device:
            return None
        names = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK")  # the rank's own, or inherited from mlaunch's
        return device_slot({n: v for n in names if (v := spec.env.get(n, os.environ.get(n))) is not None})

    def missing(self, specs: list[ProcessSpec]) -> list[ProcessSpec]:
        """The compatible ``specs`` no live standby is kept for (each standby counts once, for its own slot)."""
        return self._match(specs)[0]

    def _match(self, specs: list[ProcessSpec]) -> tuple[list[ProcessSpec], list[KeptStandby]]:
        """``specs`` without a standby of their own, and the standbys no spec has (a standby fits one slot)."""
        free = list(self._alive())
        missing = []
        for spec in filter(self.compatible, specs):
            slot = self.slot(spec)
            kept = next((s for s in free if s.python == spec.argv[0] and s.device == slot), None)
            if kept is None:
                missing.append(spec)
            else:
                free.remove(kept)
        return missing, free

    def ready_count(self) -> int:
        return sum(1 for s in self._alive() if s.state == "ready")

    def fill(self, specs: list[ProcessSpec], parent: int) -> int:
        """Start standbys until there is one per compatible spec (for its device's slot); how many were started."""
        wanted = [s for s in specs if self.compatible(s)]
        self._dirs = job_dirs(wanted)
        started = 0
        missing, unwanted = self._match(wanted)
        for stale in unwanted:  # kept for a device no rank of this attempt uses (its membership changed)
            if stale.device is not None:
                self.standbys.remove(stale)
                self._kill(stale)
        for spec in missing:
            standby = self._fork(spec, wanted, parent) if self.fork else None
            if standby is None and not self.fork:
                standby = self._start(spec, parent)
            if standby is None:
                break
            self.standbys.append(standby)
            if self.watchdog:
                self.watchdog.watch(standby.pid)
            started += 1
        return started

    # -- an attempt's own ranks, forked ---------------------------------------------------
    def prestart(self, specs: list[ProcessSpec], parent: int) -> None:
        """Start the warm parent now (with mlaunch, before planning's rendezvous and the control plane's
        meeting end), so that its imports overlap them and the first attempt's ranks can be forked from it;
        learning starts from the start file's top-level imports (``start_file_imports``)."""
        wanted = [s for s in specs if self.compatible(s)]
        if self.learner is not None and self.fork and guessing_pays(wanted):
            self.learner.guess(guess_for(wanted))
        self._parent_for(specs, parent)

    def warm_start(
        self, specs: list[ProcessSpec], parent: int, interrupted: Callable[[], bool], wait: float = WARM_START_WAIT
    ) -> int:
        """Standbys forked now for an attempt about to start its ranks, so that none of them starts cold.

        A cold rank pays interpreter start-up and its own ``import torch`` (seconds of CPU); on a
        busy node several ranks and the warm parent import at once, and a storm of faults showed
        the cost twice over: every whole-job restart started cold, and a fault in those seconds
        (before the refill, which waits for a staged step) started cold again. So every attempt
        forks its standbys before it starts, when the warm parent is up; when the parent is still
        importing (the first attempt: it started with mlaunch), the attempt waits for it up to
        ``wait`` seconds — the ranks would spend that time importing the same modules — while
        ``interrupted()`` (a stop signal, a failure) ends the wait at once. A parent that fails or
        is not ready by then leaves the ranks to start cold, as before. Nothing to preload, or
        forking off or unsafe: nothing happens. Returns how many standbys were forked.
        """
        if not self.missing(specs):
            return 0
        warm = self._parent_for(specs, parent)
        deadline = time.monotonic() + wait
        while warm is not None and (warm.state == "starting" or warm.learning):
            if interrupted() or time.monotonic() >= deadline:
                return 0
            warm.wait_news(0.05)
            self._poll(warm)
        if warm is None or warm.state != "ready" or self.parents.get(warm.python) is not warm:
            return 0
        return self.fill(specs, parent)

    def _parent_for(self, specs: list[ProcessSpec], parent: int) -> WarmParent | None:
        """The warm parent of ``specs``' ranks, started if need be; None: no forking, or nothing to preload."""
        wanted = [s for s in specs if self.compatible(s)]
        learned = self.learner is not None and bool(self.learner.learned or self.learner.guessed)
        if not (self.fork and wanted and (self.preload or learned)):
            return None
        return self._warm_parent(wanted[0], wanted, parent)

    # -- forked standbys -------------------------------------------------------------------
    def _warm_parent(self, spec: ProcessSpec, wanted: list[ProcessSpec], parent: int) -> WarmParent | None:
        """The warm parent for ``spec``'s interpreter, started if there is none; None when forking is off."""
        from launchers.standby.warm_parent_handle import WarmParent

        python = spec.argv[0]
        warm = self.parents.get(python)
        if warm is None:
            modules = self.preload + (self.learner.learned if self.learner else [])
            same = [s for s in wanted if s.argv[0] == python]
            warm = WarmParent.start(python, modules, process_env(common_env(same), self.run_id), spec.cwd, parent)
            self.parents[python] = warm
            if self.watchdog:
                self.watchdog.watch(warm.pid)
        self._poll(warm)
        return warm if self.fork else None

    def _fork(self, spec: ProcessSpec, wanted: list[ProcessSpec], parent: int) -> KeptStandby | None:
        warm = self._warm_parent(spec, wanted, parent)
        if warm is None:
            return None
        slot = self.slot(spec)
        forked = warm.fork(slot)
        if forked is None:
            self._poll(warm)  # a failed fork: say so and fall back
            return None
        popen, ready_fd = forked
        return KeptStandby(popen, ready_fd, spec.argv[0], parent=warm, generation=warm.generation, device=slot)

    def _poll(self, warm: WarmParent) -> None:
        """The warm parent's news: imports done, learned modules, or why it cannot be forked from."""
        for message in warm.poll():
            if self.learner is not None and "imported" in message:
                self.learner.imported(message)
        if warm.state == "ready" and not warm.learning and self.learner is not None:
            warm.learn(self.learner.take_guess(warm.modules))  # the start file's imports, before any rank's
        if warm.state != "failed" or self.parents.get(warm.python) is not warm:
            return  # alive, or its end was handled already
        del self.parents[warm.python]
        if self.watchdog:
            self.watchdog.unwatch(warm.pid)
        if warm.unsafe_learned and self.learner is not None:
            self.learner.refuse(warm.unsafe_module or "", warm.reason)  # a fresh warm parent comes without it
            return
        self.fork = False
        self.announce(
            f"preload: {warm.reason}; standbys are not forked from a warm parent "
            "(unsafe or impossible here): each imports preload: itself, as before"
        )

    def maintain(self) -> None:
        """Learning (``preload_learning``): the ranks' new imports go to the warm parent; stale idle standbys go.

        Called from the supervisor's loop. A warm parent that imported learned modules bumps
        its generation; idle standbys it forked before lack them, so they are killed here and
        ``fill`` forks fresh ones (milliseconds).
        """
        for warm in list(self.parents.values()):
            self._poll(warm)
            if self.learner is not None and warm.state == "ready" and not warm.learning:
                warm.learn(self.learner.new_modules(warm.modules, self._dirs))
        stale = [s for s in self._alive() if s.parent is not None and s.generation < s.parent.generation]
        for standby in stale:
            self.standbys.remove(standby)
            self._kill(standby)

    # -- standbys that import the list themselves ------------------------------------------
    def _start(self, spec: ProcessSpec, parent: int) -> KeptStandby | None:
        """One standby with ``spec``'s interpreter, environment and working directory (None: it cannot start)."""
        env = process_env(spec.env, self.run_id)
        read_fd, write_fd = os.pipe()
        env["MLAUNCH_STANDBY_READY_FD"] = str(write_fd)
        slot = self.slot(spec)
        if slot is not None:
            env[DEVICE_ENV] = slot.encode()
        argv = [spec.argv[0], "-u", "-m", "launchers.standby.standby", *self.preload, room_argument()]
        try:
            popen = start_process(argv, env, spec.cwd, parent, stdin=subprocess.PIPE, pass_fds=(write_fd,))
        except OSError:
            os.close(read_fd)
            return None
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        return KeptStandby(popen, read_fd, spec.argv[0], device=slot)

    # -- handing over ----------------------------------------------------------------------
    def take(self, spec: ProcessSpec) -> KeptStandby | None:
        """A live standby for ``spec`` (ready, or still importing: it is ahead of a cold start)."""
        if not self.compatible(spec):
            return None
        slot, alive = self.slot(spec), self._alive()
        exact = [s for s in alive if s.python == spec.argv[0] and s.device == slot]
        for standby in exact or [s for s in alive if s.fits(spec.argv[0], slot)]:
            self.standbys.remove(standby)
            return standby
        return None

    def hand_off(self, standby: KeptStandby, spec: ProcessSpec, env: dict[str, str]) -> bool:
        """Send the worker's argv/env/cwd; False if the standby could not take it (then kill it)."""
        handed: dict[str, object] = {"argv": spec.argv, "env": env, "cwd": spec.cwd, **launcher_state()}
        store = store_to_wait_for(env)
        if store is not None:
            handed["wait_for_store"] = [*store, STORE_WAIT_SECONDS]
        payload = json.dumps(handed).encode()
        stdin = standby.popen.stdin
        assert stdin is not None
        try:
            fd = stdin.fileno()
            os.set_blocking(fd, False)
            sent = os.write(fd, payload)
            stdin.close()
            if sent != len(payload):
                raise BlockingIOError("spec larger than the pipe buffer")
        except OSError:
            self._kill(standby)
            return False
        standby.close_ready()
        self.handed_off += 1
        return True

    def _kill(self, standby: KeptStandby) -> None:
        with contextlib.suppress(OSError):
            os.killpg(standby.pid, signal.SIGKILL)
        if self.watchdog:
            self.watchdog.unwatch(standby.pid)
        standby.close_ready()
        for stream in (standby.popen.stdin, standby.popen.stdout, standby.popen.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def close(self) -> None:
        """Kill every standby that was not handed off, and the warm parents (mlaunch is finishing)."""
        for standby in self.standbys:
            self._kill(standby)
        self.standbys = []
        for warm in self.parents.values():
            warm.close()
            if self.watchdog:
                self.watchdog.unwatch(warm.pid)
        self.parents = {}
        reap_unknown()
