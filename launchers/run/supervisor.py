"""Process supervision, in one place (as torch.distributed.elastic.multiprocessing keeps it).

What a user relies on, and how it is done:
- Each worker runs in its own session/process group, so a signal reaches the worker *and*
  whatever it started (data-loader workers, a wrapper script's child).
- Output is streamed with a ``[rank N]`` prefix (``[node K rank N]`` when several nodes are
  simulated) and copied, unprefixed, to one log file per rank.
- The first failure tears the group down: SIGTERM to every group, the grace period, then
  SIGKILL. The outcome carries the failing rank's own exit code (128+signal if it died of a
  signal) and the last lines of its output.
- SIGTERM/SIGINT/SIGHUP to mlaunch are forwarded to every group; after the grace period
  the rest is SIGKILLed and mlaunch exits 128+signal. SIGUSR1/SIGUSR2 are forwarded as is
  (SLURM-style preemption notices), without stopping anything.
- If mlaunch is SIGKILLed no worker survives: each worker has a parent-death signal, and a
  forked watchdog (which only waits for mlaunch's end of a pipe to close) kills every
  process group and every process carrying this run's ``MLAUNCH_RUN_ID``.
- No zombies: mlaunch is a child subreaper, the loop reaps every child (orphaned
  grandchildren included), and stragglers are killed at the end. This is also what makes
  mlaunch a correct PID 1 in a container.

The loop is single-threaded: one selector over the output pipes and a signal wake-up pipe
(SIGCHLD included), so there is no thread to race a fork and no polling delay on exit.

Graceful-exit hooks (issue 4): ``on_failure`` runs right after the first failure, while the
other workers are frozen with SIGSTOP (the runner persists the ranks' staged state there);
then they get SIGTERM and SIGCONT — or SIGKILL when the hook says there is nothing left for
them to save; ``reserve`` says how much of the grace period to keep, on a stop by signal, for
persisting staged state of workers that never finish (hung, blocked in a collective);
``tick`` runs about twice a second (the grace-budget monitor); a ``StandbyPool``
hands warm, pre-imported processes the workers' argv/env instead of starting cold ones.
The watchdog's final sweep also unlinks the run's shared-memory staging segments.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO, Literal

from launchers.elastic import staging
from launchers.plan import ProcessSpec
from launchers.run import signals as early_signals

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
TAIL_LINES = 15

_libc: ctypes.CDLL | None = None


def _prctl(option: int, value: int) -> bool:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return int(_libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphaned grandchildren are re-parented to us (and reaped by us) instead of to init."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def exit_code_of(status: int) -> int:
    """waitpid status → shell-style exit code (128+signal when killed by a signal)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


# ----------------------------------------------------------------------------------------
# Signals
# ----------------------------------------------------------------------------------------


class SignalRouter:
    """Turns signals into bytes on a pipe the supervisor's selector watches.

    Installed once per mlaunch run (it outlives restarts and the backoff between them). The
    Python handlers do nothing: ``signal.set_wakeup_fd`` writes each signal number to the
    pipe. Outside the main thread signals cannot be caught; the supervisor then polls.
    """

    HANDLED = (*STOP_SIGNALS, *FORWARD_SIGNALS, signal.SIGCHLD)

    def __init__(self) -> None:
        self.active = False
        self.read_fd = -1
        self._write_fd = -1
        self._previous: dict[int, object] = {}
        self._old_wakeup = -1
        self.pending: list[int] = []

    def __enter__(self) -> SignalRouter:
        if threading.current_thread() is not threading.main_thread():
            return self
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)
        for sig in self.HANDLED:
            self._previous[sig] = signal.signal(sig, _noop_handler)
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self.active = True
        self.pending.extend(early_signals.take())  # what came before these handlers (mlaunch's start-up)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        signal.set_wakeup_fd(self._old_wakeup)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        os.close(self.read_fd)
        os.close(self._write_fd)
        self.active = False

    def drain(self) -> list[int]:
        """Signals received since the last call, in order."""
        got, self.pending = self.pending, []
        if self.active:
            while True:
                try:
                    data = os.read(self.read_fd, 512)
                except BlockingIOError:
                    break
                if not data:
                    break
                got.extend(data)
        return got

    def wait(self, seconds: float) -> list[int]:
        """Sleep up to ``seconds`` but return early with any stop/forward signal received."""
        end = time.monotonic() + seconds
        while True:
            sigs = [s for s in self.drain() if s != signal.SIGCHLD]
            _reap_unknown()
            if sigs:
                return sigs
            left = end - time.monotonic()
            if left <= 0:
                return []
            if self.active:
                select.select([self.read_fd], [], [], left)
            else:
                time.sleep(min(left, 0.1))


def _noop_handler(signum: int, frame: object) -> None:
    """Handled only so set_wakeup_fd reports it; the supervisor loop does the work."""


def _reap_unknown() -> None:
    """Reap any exited child (used between attempts, when no supervisor loop runs)."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break


# ----------------------------------------------------------------------------------------
# Watchdog: survives a SIGKILL of mlaunch and cleans up after it
# ----------------------------------------------------------------------------------------


class Watchdog:
    """A forked helper that kills the job's processes when mlaunch's pipe end closes.

    Forked before any thread exists (fork is cheap, no interpreter start-up). It ignores
    the stop signals (so a Ctrl-C aimed at mlaunch's terminal group does not take it away
    early) and only reads: ``+PGID``/``-PGID`` lines. On EOF — mlaunch exited normally or
    was killed — it SIGKILLs the groups still listed and every process whose environment
    carries this run's marker (grandchildren that escaped into their own session).
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.pid = 0
        self._fd = -1

    def start(self) -> Watchdog:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(write_fd)
                for sig in (*STOP_SIGNALS, *FORWARD_SIGNALS):
                    signal.signal(sig, signal.SIG_IGN)
                signal.set_wakeup_fd(-1)
                _watchdog_main(read_fd, self.run_id, os.getppid())
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid = pid
        self._fd = write_fd
        return self

    def _send(self, line: str) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fd, line.encode())

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def unwatch(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def close(self, wait: float = 5.0) -> None:
        """Let the watchdog do its final sweep and exit."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                return
            time.sleep(0.01)


def _watchdog_main(read_fd: int, run_id: str, parent: int) -> None:
    groups: set[int] = set()
    buf = b""
    while True:
        try:
            data = os.read(read_fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    kill_marked_processes(run_id, exclude={os.getpid(), parent})
    staging.unlink_run(run_id)  # shared memory outlives processes: free it whatever happened


def kill_marked_processes(run_id: str, exclude: Iterable[int] = ()) -> list[int]:
    """SIGKILL every process whose initial environment has ``MLAUNCH_RUN_ID=<run_id>``."""
    marker = f"MLAUNCH_RUN_ID={run_id}".encode()
    skip = set(exclude)
    killed: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return killed
    for entry in entries:
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
    return killed


def _children_of(pid: int) -> list[int]:
    children: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # field 4 (ppid) comes after the parenthesised command, which may contain spaces
        rest = stat[stat.rfind(b")") + 2 :].split()
        if len(rest) > 1 and int(rest[1]) == pid:
            children.append(int(entry))
    return children


# ----------------------------------------------------------------------------------------
STORE_WAIT_SECONDS = 1.0  # the most a warm rank waits for rank 0's store (see standby.wait_for_listener)


def store_to_wait_for(env: dict[str, str]) -> tuple[str, int] | None:
    """(MASTER_ADDR, MASTER_PORT) for a torch.distributed rank other than 0, else None."""
    host, port, rank = env.get("MASTER_ADDR"), env.get("MASTER_PORT", ""), env.get("RANK", "")
    if not host or not port.isdigit() or not rank.isdigit() or rank == "0":
        return None
    return host, int(port)


# Starting a process (a worker or a warm standby): the same guarantees for both
# ----------------------------------------------------------------------------------------


def _start_process(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    parent: int,
    *,
    stdin: int = subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Own session/process group, SIGKILL when mlaunch dies, output to pipes."""

    def child_setup() -> None:
        # Die with mlaunch even if it is SIGKILLed; if it already died, do not run at all.
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(137)

    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=child_setup,  # noqa: PLW1509 - the supervisor loop is single-threaded
        close_fds=True,
        pass_fds=pass_fds,
    )


@dataclass
class _Standby:
    popen: subprocess.Popen[bytes]
    ready_fd: int
    python: str
    state: Literal["starting", "ready", "dead"] = "starting"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> str:
        """Read the ready pipe without blocking: 'R' → ready, EOF → dead (a preload failed)."""
        if self.state == "starting" and self.ready_fd >= 0:
            try:
                data = os.read(self.ready_fd, 16)
            except BlockingIOError:
                return self.state
            except OSError:
                data = b""
            self.state = "ready" if data.startswith(b"R") else "dead"
            os.close(self.ready_fd)
            self.ready_fd = -1
        return self.state


class StandbyPool:
    """Warm standby workers for fast restarts (see ``launchers.run.standby`` for the other side).

    One standby per worker slot, in its own process group with the same parent-death
    signal, ``MLAUNCH_RUN_ID`` and watchdog registration as a worker. Importing torch takes
    seconds of CPU per process, so standbys start only once the attempt's workers are past
    their own start-up: ``delay`` seconds after the attempt began *and* once a rank staged a
    step (``launchers.elastic``) or every worker wrote output — or after ``fallback`` seconds. A
    restart hands each new worker to a standby when its start command is
    ``<python> -u script.py ...`` with the standby's interpreter; anything else starts cold.
    """

    def __init__(self, preload: list[str], *, run_id: str = "", watchdog: Watchdog | None = None, delay: float = 1.0):
        self.preload = list(preload)
        self.run_id = run_id
        self.watchdog = watchdog
        self.delay = delay
        self.standbys: list[_Standby] = []
        self.handed_off = 0
        self.cold_starts = 0
        self.fallback = 30.0
        self._attempt_wall = time.time()

    def new_attempt(self) -> None:
        """An attempt starts now: refill only after its workers show progress."""
        self._attempt_wall = time.time()

    def may_fill(self, elapsed: float, all_spoke: bool = False) -> bool:
        """Whether the attempt's workers are past their start-up (see the class docstring)."""
        if elapsed < self.delay:
            return False
        if elapsed >= self.fallback or all_spoke or not self.run_id:
            return True
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
        return {s.pid for s in self.standbys}

    def _alive(self) -> list[_Standby]:
        self.standbys = [s for s in self.standbys if s.poll() != "dead"]
        return self.standbys

    def ready_count(self) -> int:
        return sum(1 for s in self._alive() if s.state == "ready")

    def fill(self, specs: list[ProcessSpec], parent: int) -> int:
        """Start standbys until there is one per compatible spec; returns how many were started."""
        wanted = [s for s in specs if self.compatible(s)]
        started = 0
        for spec in wanted[len(self._alive()) :]:
            env = dict(os.environ)
            env.update(spec.env)
            if self.run_id:
                env["MLAUNCH_RUN_ID"] = self.run_id
            read_fd, write_fd = os.pipe()
            env["MLAUNCH_STANDBY_READY_FD"] = str(write_fd)
            try:
                popen = _start_process(
                    [spec.argv[0], "-u", "-m", "launchers.run.standby", *self.preload],
                    env,
                    spec.cwd,
                    parent,
                    stdin=subprocess.PIPE,
                    pass_fds=(write_fd,),
                )
            except OSError:
                os.close(read_fd)
                return started
            finally:
                os.close(write_fd)
            os.set_blocking(read_fd, False)
            self.standbys.append(_Standby(popen, read_fd, spec.argv[0]))
            if self.watchdog:
                self.watchdog.watch(popen.pid)
            started += 1
        return started

    def take(self, spec: ProcessSpec) -> _Standby | None:
        """A live standby for ``spec`` (ready, or still importing: it is ahead of a cold start)."""
        if not self.compatible(spec):
            return None
        for standby in self._alive():
            if standby.python == spec.argv[0]:
                self.standbys.remove(standby)
                return standby
        return None

    def hand_off(self, standby: _Standby, spec: ProcessSpec, env: dict[str, str]) -> bool:
        """Send the worker's argv/env/cwd; False if the standby could not take it (then kill it)."""
        handed: dict[str, object] = {"argv": spec.argv, "env": env, "cwd": spec.cwd}
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
        if standby.ready_fd >= 0:
            os.close(standby.ready_fd)
            standby.ready_fd = -1
        self.handed_off += 1
        return True

    def _kill(self, standby: _Standby) -> None:
        with contextlib.suppress(OSError):
            os.killpg(standby.pid, signal.SIGKILL)
        if self.watchdog:
            self.watchdog.unwatch(standby.pid)
        if standby.ready_fd >= 0:
            os.close(standby.ready_fd)
            standby.ready_fd = -1
        for stream in (standby.popen.stdin, standby.popen.stdout, standby.popen.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def close(self) -> None:
        """Kill every standby that was not handed off (mlaunch is finishing)."""
        for standby in self.standbys:
            self._kill(standby)
        self.standbys = []
        _reap_unknown()


# ----------------------------------------------------------------------------------------
# The supervisor
# ----------------------------------------------------------------------------------------


@dataclass
class Failure:
    label: str
    rank: int
    pid: int
    exit_code: int
    signal: int | None
    tail: list[str]
    log: str | None

    def describe(self) -> str:
        if self.signal is not None:
            how = f"was killed by {signal_name(self.signal)} (exit code {self.exit_code})"
        else:
            how = f"exited with code {self.exit_code}"
        return f"{self.label} (pid {self.pid}) {how}"


@dataclass
class Outcome:
    status: Literal["succeeded", "failed", "signalled"]
    exit_code: int
    failure: Failure | None = None
    signal: int | None = None
    exit_codes: dict[str, int] = field(default_factory=dict)  # label → exit code
    grace_expired: bool = False  # workers were still alive when the grace period ended (SIGKILLed)
    stop_started: float | None = None  # time.monotonic() when the stop (SIGTERM to the workers) began


@dataclass
class _Worker:
    spec: ProcessSpec
    label: str
    prefix: bytes
    popen: subprocess.Popen[bytes]
    log: IO[bytes] | None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    buffers: dict[int, bytes] = field(default_factory=dict)
    returncode: int | None = None
    status: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid


class Supervisor:
    """Run one attempt of a group of processes to its end and report how it ended."""

    def __init__(
        self,
        processes: list[ProcessSpec],
        *,
        grace_period: float = 30.0,
        run_id: str = "",
        signals: SignalRouter | None = None,
        watchdog: Watchdog | None = None,
        out: BinaryIO | None = None,
        err: BinaryIO | None = None,
        labels: dict[int, str] | None = None,
        announce: Callable[[str], None] | None = None,
        log_mode: str = "ab",
        standbys: StandbyPool | None = None,
        on_failure: Callable[[Failure], str | None] | None = None,
        tick: Callable[[], None] | None = None,
        reserve: Callable[[], float] | None = None,
    ) -> None:
        self.processes = processes
        self.grace_period = grace_period
        self.run_id = run_id
        self.signals = signals or SignalRouter()
        self.watchdog = watchdog
        self.out = out or sys.stdout.buffer
        self.err = err or sys.stderr.buffer
        self.labels = labels or {}
        self.announce = announce or (lambda msg: _print_err(msg))
        self.log_mode = log_mode
        self.workers: list[_Worker] = []
        self._by_pid: dict[int, _Worker] = {}
        self._by_fd: dict[int, tuple[_Worker, bool]] = {}
        self._selector = selectors.DefaultSelector()
        self._kill_at: float | None = None
        self._failure: Failure | None = None
        self._signal: int | None = None
        self._stopping = False
        self._parent_pid = os.getpid()
        self.standbys = standbys
        if standbys is not None:
            standbys.new_attempt()
        self.on_failure = on_failure
        self.tick = tick
        self.reserve = reserve
        self._kill_after = grace_period
        self._started = time.monotonic()
        self._next_tick = 0.0
        self.stop_started: float | None = None
        self.grace_expired = False
        self._standbys_announced = False

    # -- public ----------------------------------------------------------------------------
    def run(self) -> Outcome:
        try:
            self._start_all()
            if self._failure is None and self._signal is None:
                self._loop()
            else:
                self._stop_all(signal.SIGTERM)
                self._loop()
        finally:
            self._final_cleanup()
        codes = {w.label: w.returncode for w in self.workers if w.returncode is not None}
        if self._signal is not None and self._failure is None:
            outcome = Outcome("signalled", 128 + self._signal, signal=self._signal, exit_codes=codes)
        elif self._failure is not None:
            outcome = Outcome(
                "failed",
                self._failure.exit_code or 1,
                failure=self._failure,
                signal=self._signal,
                exit_codes=codes,
            )
        else:
            outcome = Outcome("succeeded", 0, exit_codes=codes)
        outcome.grace_expired = self.grace_expired
        outcome.stop_started = self.stop_started
        return outcome

    # -- starting --------------------------------------------------------------------------
    def _start_all(self) -> None:
        if self.signals.active:
            self._selector.register(self.signals.read_fd, selectors.EVENT_READ, None)
        for index, spec in enumerate(self.processes):
            for sig in self.signals.drain():
                self._on_signal(sig)
            if self._signal is not None or self._failure is not None:
                return
            label = self.labels.get(index) or spec.label or f"rank {spec.rank}"
            try:
                self._spawn(spec, label)
            except OSError as exc:
                self._failure = Failure(
                    label,
                    spec.rank,
                    0,
                    127 if isinstance(exc, FileNotFoundError) else 126,
                    None,
                    [f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}"],
                    spec.log,
                )
                return

    def _spawn(self, spec: ProcessSpec, label: str) -> None:
        env = dict(os.environ)
        env.update(spec.env)
        if self.run_id:
            env["MLAUNCH_RUN_ID"] = self.run_id
        log = None
        if spec.log:
            Path(spec.log).parent.mkdir(parents=True, exist_ok=True)
            log = open(spec.log, self.log_mode)  # noqa: SIM115 - closed in _final_cleanup
        popen = None
        standby = self.standbys.take(spec) if self.standbys else None
        if standby is not None and self.standbys is not None and self.standbys.hand_off(standby, spec, env):
            popen = standby.popen  # already watched by the watchdog, in its own group
        if popen is None:
            if self.standbys is not None and self.standbys.compatible(spec):
                self.standbys.cold_starts += 1
            popen = _start_process(spec.argv, env, spec.cwd, self._parent_pid)
            if self.watchdog:
                self.watchdog.watch(popen.pid)
        worker = _Worker(spec, label, f"[{label}] ".encode(), popen, log)
        self.workers.append(worker)
        self._by_pid[popen.pid] = worker
        for stream, is_err in ((popen.stdout, False), (popen.stderr, True)):
            assert stream is not None
            fd = stream.fileno()
            os.set_blocking(fd, False)
            worker.buffers[fd] = b""
            self._by_fd[fd] = (worker, is_err)
            self._selector.register(fd, selectors.EVENT_READ, None)

    # -- the loop --------------------------------------------------------------------------
    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if w.returncode is None]

    def _loop(self) -> None:
        while self._live():
            timeout = 0.5 if self.signals.active else 0.05
            if self._kill_at is not None:
                timeout = max(0.0, min(timeout, self._kill_at - time.monotonic()))
            for key, _ in self._selector.select(timeout):
                fd = int(key.fd)
                if fd == self.signals.read_fd:
                    continue
                self._read(fd)
            for sig in self.signals.drain():
                self._on_signal(sig)
            self._reap()
            if self._kill_at is not None and time.monotonic() >= self._kill_at:
                live = self._live()
                if live:
                    self.grace_expired = True
                    if self._kill_after < self.grace_period:
                        what = (
                            f"{self._kill_after:.3g}s of the {self.grace_period:g}s grace period are over "
                            "(the rest is kept for the agent-side save)"
                        )
                    else:
                        what = f"grace period of {self.grace_period:g}s is over"
                    self.announce(f"{what}; SIGKILL to " + ", ".join(w.label for w in live))
                self._kill_groups(signal.SIGKILL)
                self._kill_at = None
            self._housekeeping()

    def _housekeeping(self) -> None:
        """Standby refill and the periodic hook; neither may break supervision."""
        now = time.monotonic()
        pool = self.standbys
        if pool is not None and not self._stopping:
            wanted = sum(1 for spec in self.processes if pool.compatible(spec))
            spoke = all(w.tail for w in self.workers) and len(self.workers) == len(self.processes)
            if len(pool._alive()) < wanted and pool.may_fill(now - self._started, spoke):
                try:
                    pool.fill(self.processes, self._parent_pid)
                except OSError as exc:
                    self.announce(f"cannot start standby workers: {exc}")
                    self.standbys = None
            if self.standbys is not None and not self._standbys_announced and wanted and pool.ready_count() >= wanted:
                self._standbys_announced = True
                self.announce(f"{wanted} warm standby workers ready for a restart")
        if self.tick is not None and now >= self._next_tick:
            self._next_tick = now + 0.5
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - a monitor must never stop supervision
                self.announce(f"monitor error (ignored): {exc!r}")

    def _read(self, fd: int) -> None:
        worker, is_err = self._by_fd[fd]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_fd(fd)
            return
        if worker.log:
            worker.log.write(data)
            worker.log.flush()
        buf = worker.buffers[fd] + data
        *lines, worker.buffers[fd] = buf.split(b"\n")
        if lines:
            self._emit(worker, lines, is_err)

    def _emit(self, worker: _Worker, lines: list[bytes], is_err: bool) -> None:
        stream = self.err if is_err else self.out
        chunk = b"".join(worker.prefix + line + b"\n" for line in lines)
        with contextlib.suppress(OSError, ValueError):
            stream.write(chunk)
            stream.flush()
        worker.tail.extend(line.decode("utf-8", "replace") for line in lines)

    def _close_fd(self, fd: int) -> None:
        worker, is_err = self._by_fd.pop(fd)
        rest = worker.buffers.pop(fd, b"")
        if rest:
            self._emit(worker, [rest], is_err)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)
        stream = worker.popen.stderr if is_err else worker.popen.stdout
        if stream is not None:
            stream.close()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            worker = self._by_pid.get(pid)
            if worker is not None and worker.returncode is None:
                self._on_exit(worker, status)

    def _on_exit(self, worker: _Worker, status: int) -> None:
        code = exit_code_of(status)
        worker.status = status
        worker.returncode = code
        worker.popen.returncode = code  # subprocess must not wait on a pid we reaped
        # Whatever the worker left in its group (a background child) goes with it.
        with contextlib.suppress(OSError):
            os.killpg(worker.pid, signal.SIGKILL)
        if self.watchdog:
            self.watchdog.unwatch(worker.pid)
        self._drain_pipes(worker)
        if self._stopping:
            return
        if code != 0:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            self._failure = Failure(
                worker.label, worker.spec.rank, worker.pid, code, sig, list(worker.tail), worker.spec.log
            )
            others = self._live()
            if others:
                self.announce(f"{self._failure.describe()}; stopping the other {len(others)} processes")
            if self.on_failure is None:
                self._stop_all(signal.SIGTERM)
                return
            # The hook runs while the others are frozen (SIGSTOP): they cannot overwrite the
            # state it reads, nor take the CPU it needs; then they get SIGTERM, and SIGCONT.
            self._kill_groups(signal.SIGSTOP)
            kill_now = None
            try:
                kill_now = self.on_failure(self._failure)
            except Exception as exc:  # noqa: BLE001 - the teardown goes on whatever the hook did
                self.announce(f"failure hook error (ignored): {exc!r}")
            finally:
                live = self._live()
                if kill_now and live:
                    # The hook saved what these processes could have saved (the agent-side
                    # flash save committed their newest step): waiting out the grace period
                    # would only delay the restart.
                    self.announce(f"{kill_now}; SIGKILL to " + ", ".join(w.label for w in live))
                    self._kill_groups(signal.SIGKILL)
                self._stop_all(signal.SIGTERM)
                self._kill_groups(signal.SIGCONT)
            return
        if all(w.returncode == 0 for w in self.workers if w.spec.required):
            services = [w for w in self._live() if not w.spec.required]
            if services:
                self.announce("every required process finished; stopping " + ", ".join(w.label for w in services))
                self._stop_all(signal.SIGTERM)

    def _drain_pipes(self, worker: _Worker) -> None:
        """Read what the exited process left in its pipes (so its last lines are not lost)."""
        fds = [fd for fd, (w, _) in self._by_fd.items() if w is worker]
        end = time.monotonic() + 0.2
        while fds and time.monotonic() < end:
            ready, _, _ = select.select(fds, [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break
            for fd in ready:
                self._read(fd)
            fds = [fd for fd in fds if fd in self._by_fd]

    # -- stopping --------------------------------------------------------------------------
    def _on_signal(self, sig: int) -> None:
        if sig == signal.SIGCHLD:
            return
        if sig in (signal.SIGUSR1, signal.SIGUSR2):
            self.announce(f"forwarding {signal_name(sig)} to {len(self._live())} processes")
            self._kill_groups(sig)
            return
        if self._signal is None and not self._stopping:
            self._signal = sig
            reserve = self._agent_reserve()
            kept = f" ({reserve:.3g}s of the grace period kept for the agent-side save)" if reserve else ""
            self.announce(
                f"received {signal_name(sig)}; forwarding it to {len(self._live())} processes, "
                f"SIGKILL in {self.grace_period - reserve:.3g}s{kept}"
            )
            self._stop_all(sig, kill_after=self.grace_period - reserve)
        elif self._signal is None:
            self._signal = sig  # already stopping after a failure: keep the failure's exit code
        elif sig == signal.SIGINT and self._kill_at is not None:
            self.announce("second interrupt: SIGKILL now")
            self._kill_groups(signal.SIGKILL)
            self._kill_at = None
        else:
            self.announce(f"received {signal_name(sig)} again; already stopping (SIGINT twice kills at once)")

    def _agent_reserve(self) -> float:
        """Seconds at the end of the grace period kept for the agent-side save (0 when nothing is staged)."""
        if self.reserve is None:
            return 0.0
        try:
            return max(0.0, min(float(self.reserve()), self.grace_period / 2))
        except Exception as exc:  # noqa: BLE001 - an estimate must never block a stop
            self.announce(f"reserve estimate failed (ignored): {exc!r}")
            return 0.0

    def _stop_all(self, sig: int, kill_after: float | None = None) -> None:
        if self.stop_started is None:
            self.stop_started = time.monotonic()
        self._stopping = True
        self._kill_groups(sig)
        if self._kill_at is None:
            self._kill_after = self.grace_period if kill_after is None else kill_after
            self._kill_at = time.monotonic() + self._kill_after

    def _kill_groups(self, sig: int) -> None:
        for worker in self._live():
            try:
                os.killpg(worker.pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, sig)

    def _final_cleanup(self) -> None:
        # Anything still alive (an exception in the loop) is killed; then the pipes are
        # drained, logs closed, orphans we adopted as subreaper killed and reaped.
        if self._live():
            self._kill_groups(signal.SIGKILL)
            end = time.monotonic() + 5
            while self._live() and time.monotonic() < end:
                self._reap()
                time.sleep(0.01)
        for fd in list(self._by_fd):
            self._read_all(fd)
        for worker in self.workers:
            if worker.log:
                worker.log.close()
        watchdog_pid = self.watchdog.pid if self.watchdog else -1
        standby_pids = self.standbys.pids() if self.standbys else set()
        for child in _children_of(os.getpid()):
            if child != watchdog_pid and child not in self._by_pid and child not in standby_pids:
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
        self._reap()
        if self.signals.active:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.signals.read_fd)
        self._selector.close()

    def _read_all(self, fd: int) -> None:
        end = time.monotonic() + 0.5
        while fd in self._by_fd and time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                break
            self._read(fd)
        if fd in self._by_fd:
            self._close_fd(fd)


def _print_err(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"mlaunch: {message}\n")
        sys.stderr.flush()


__all__ = [
    "Failure",
    "Outcome",
    "SignalRouter",
    "StandbyPool",
    "Supervisor",
    "Watchdog",
    "become_subreaper",
    "exit_code_of",
    "kill_marked_processes",
]
