"""``@elastic.recoverable``: a peer's failure re-forms the group around this process instead of ending it.

::

    from launchers import elastic

    @elastic.recoverable
    def train():
        dist.init_process_group("gloo")           # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT as always
        ckpt = elastic.Checkpointer()
        state = ckpt.load_latest()                 # the step every rank staged, committed by mlaunch
        for step in range(start, total):
            ...

    train()

Why: without it every fault restarts every rank — each one starts a process, imports torch,
initialises its device and reads the state back — although only one of them failed. With it the
failed rank alone is replaced (by a warm standby) and the survivors keep their process, their
imports, their device context and their data-loader workers' parent: the group re-forms around them.

How (the rank's half; mlaunch's half is ``launchers.run.in_place``): the wrapper declares the
process recoverable (``ipc.recovery``). When a peer fails, the survivor's pending collective raises
(gloo: "Connection closed by peer" as the dead process's sockets close; a hung rank is SIGKILLed by
mlaunch first, so its sockets close too). The wrapper then tears down the process group (the old
groups stay referenced: destroying a gloo group's threads can deadlock on the GIL, see
``guard.end_process_groups``), drops the failed call's frames, waits for mlaunch's word with the
next attempt's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``,
``MLAUNCH_RESTART_COUNT``...), applies it, and calls the function again. Inside, ``load_latest()``
returns the newest step every rank staged, which mlaunch committed from the ranks' shared memory
while they waited (the flash save), so every rank of the new group starts from the same step; each
rank reads it from the segments mlaunch kept for it (``ipc.kept_segments``), not from storage.

An exception that no peer failure explains (mlaunch says nothing within ``notice_within`` seconds) is
the rank's own and is raised as before; mlaunch then restarts per ``restart:``. When mlaunch cannot
recover in place (a node was lost, a rank that is not recoverable, a second fault during recovery) it
stops this process and restarts the job whole, as without the decorator, and says so.
Outside mlaunch the decorator calls the function once, nothing more.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

from launchers.elastic.ipc import progress, rank_segment, recovery
from launchers.elastic.ranks import collective, env

F = TypeVar("F", bound=Callable[..., Any])

NOTICE_WITHIN = 3.0  # seconds a failed collective waits for mlaunch to say a peer failed
recoveries = 0  # how often this process re-formed in place (for the script's own logging and tests)


@overload
def recoverable(fn: F) -> F: ...
@overload
def recoverable(*, notice_within: float = NOTICE_WITHIN) -> Callable[[F], F]: ...


def recoverable(fn: Any = None, *, notice_within: float = NOTICE_WITHIN) -> Any:
    """Decorate the function that trains: a peer's failure calls it again in this process (see the module)."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not recovery.declare():
                return function(*args, **kwargs)  # not under mlaunch: nobody to re-form with
            _Watcher.start()
            try:
                while True:
                    before = _Watcher.call_started(_socket_inodes())
                    failed = _call(function, args, kwargs)
                    if not isinstance(failed, _Failed):
                        return failed
                    word = _after_failure(before, notice_within)
                    if word is None:
                        raise failed.error
                    del failed  # the failed call's frames (its model, its optimizer) go before the next call
                    while word is not None:  # a newer word when the attempt being joined was superseded meanwhile
                        word = _rejoin(word)
            finally:
                recovery.withdraw()

        return wrapper  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap


class _Failed:
    """The exception of a failed call, held outside the ``except`` block (so its frames can be dropped)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _call(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a stop (SystemExit, GracefulExit) and Ctrl-C pass through
        return _Failed(exc)


class _Watcher:
    """A thread that ends this rank's waits when mlaunch says ``hold``, whether or not its own collective failed.

    The ranks of a group can be waiting in different collectives when a peer dies (one still in the
    backward pass's all-reduce, another already in the next agreement): each waits on another survivor,
    not on the dead rank, and neither ever fails. mlaunch's ``hold`` reaches every survivor; this thread
    then shuts down the failed call's connections in its process, so every wait ends at once. It looks
    at the file's modification time every ``POLL`` seconds (a ``stat``: no cost worth measuring).

    ``lock``: the answer to a hold (is it about the attempt this process is in; which sockets are new since
    the call began; shut them down) is one step against the main thread's move to the next attempt
    (``_rejoin`` applies the new environment under it). Without it a watcher that read a hold of attempt N,
    then lost the CPU while the main thread already joined N+1, shut down N+1's new store and gloo
    connections: that rank failed with "Broken pipe", or a pair's handshake never completed and the whole
    group waited in ``init_process_group`` until ``monitor.rejoin_timeout`` (1 in 80 netns kills).
    """

    POLL = 0.01
    lock = threading.Lock()
    _thread: Any = None
    _before: set[str] = set()
    _acted_on = -1  # the attempt whose hold (or go past it) this thread already answered

    @classmethod
    def start(cls) -> None:
        if cls._thread is None:
            cls._thread = threading.Thread(target=cls._run, name="mlaunch-recoverable", daemon=True)
            cls._thread.start()

    @classmethod
    def call_started(cls, before: set[str]) -> set[str]:
        with cls.lock:
            cls._before = before
        return before

    @classmethod
    def _run(cls) -> None:
        path = recovery.path_of(env.run_id(), os.getpid())
        seen = 0
        while True:
            time.sleep(cls.POLL)
            try:
                changed = os.stat(path).st_mtime_ns
            except OSError:
                continue
            if changed == seen:
                continue
            seen = changed
            word = recovery.read(path)
            if word is not None:
                cls.answer(word)

    @classmethod
    def answer(cls, word: recovery.Word) -> int:
        """mlaunch's word about the attempt this process is in: the current call's connections shut down (how many).

        A ``hold`` of this attempt, or a ``go`` to a later one: mlaunch writes the ``go`` some 20 ms after the
        ``hold``, and a watcher that did not get the CPU in between sees only the ``go``. Answering only a hold
        left such a rank waiting in its old collective for ever (a survivor in the step's agreement while the
        others formed the next group: the whole job restarted after ``monitor.rejoin_timeout``, 1 kill in
        about 1,000 on two hosts)."""
        with cls.lock:
            mine = env.attempt()  # read here, not before the lock: the main thread may have moved on meanwhile
            held = word.state == recovery.HOLD and word.attempt >= mine
            moved_on = word.state == recovery.GO and word.attempt > mine
            if not (held or moved_on) or cls._acted_on >= mine:
                return 0
            cls._acted_on = mine
            return _close_call_connections(cls._before)


def _after_failure(before: set[str], notice_within: float) -> recovery.Word | None:
    """The group is torn down; mlaunch's ``go`` for the next attempt, or None (the failure is this rank's own)."""
    recovery.mark_left()
    _close_call_connections(before)
    _tear_down_groups()
    return recovery.await_go(notice_within, _stop_requested)


def _socket_inodes() -> set[str]:
    """The sockets this process holds now (``socket:[inode]``), before a call of the training function."""
    found: set[str] = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith("socket:"):
                found.add(target)
    return found


def _close_call_connections(before: set[str]) -> int:
    """Shut down the TCP connections the failed call opened (its process group's): the peers' waits end now.

    A survivor whose collective failed is often not the only one waiting: in a ring or tree the ranks
    that are not the dead one's neighbours wait on those that are, and a destroyed gloo group keeps its
    connections open until its last reference goes (``_tear_down_groups`` keeps them). Shutting the
    failed call's connections down makes every such wait end with "connection closed", rank by rank,
    in milliseconds. Only connected TCP sockets opened during the failed call are touched (not
    listeners: gloo aborts the process when its listener fails), and none to a port below 1024 (a
    client of a web service); everything the failed call built is rebuilt by the next call anyway,
    so a client that must outlive a recovery is made outside the decorated function.
    """
    import socket

    closed = 0
    new = _socket_inodes() - before
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return 0
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") not in new:
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                peer = sock.getpeername()  # OSError for a listener: left alone
                if peer[1] >= 1024:
                    sock.shutdown(socket.SHUT_RDWR)
                    closed += 1
        except OSError:
            pass
        finally:
            sock.close()  # the duplicate only; the group's own fd stays (shut down)
    return closed


def _stop_requested() -> bool:
    guard = sys.modules.get("launchers.elastic.guard")
    current = getattr(guard, "_guard", None) if guard is not None else None
    return bool(current is not None and current.requested)


def _tear_down_groups() -> None:
    """``destroy_process_group`` of whatever the failed call initialised; the group objects stay referenced."""
    from launchers.elastic.guard import end_process_groups

    end_process_groups()  # the same teardown as a graceful exit's (the GIL deadlock it avoids applies here too)
    _reset_group_names()


def _reset_group_names() -> None:
    """torch names each unnamed process group by a process-wide counter, reset when the world group is destroyed.

    A call cut off inside ``init_process_group`` (its world group never formed: a peer failed meanwhile) left
    the counter advanced, with no world group to destroy: this process's next ``init_process_group`` named its
    world group "1" where the replacement's, a fresh process, is "0", and their gloo full meshes waited on
    different store keys until the group's timeout (30 minutes). Seen as a re-formed group stuck in
    ``connectFullMesh``, on one host and on two. Reset as ``destroy_process_group`` resets it.
    """
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    if world is not None and not c10d.is_initialized():  # type: ignore[union-attr]
        world.group_count = 0


def _rejoin(word: recovery.Word) -> recovery.Word | None:
    """Become this process's rank in the next attempt: its environment, fresh shared-memory files.

    Returns mlaunch's newer word instead when the attempt being joined was superseded while this process
    waited for its rank 0's store (that rank failed before it listened: mlaunch already holds or plans the
    attempt after). Calling the function then would wait in ``init_process_group`` for a store that never
    comes. (Seen on two hosts when the rank still re-declared itself in mlaunch's file, over the newer
    ``go``: a group that re-formed only after ``monitor.rejoin_timeout``, every rank restarted. That file is
    mlaunch's alone now; the rank says it joined in its own, ``recovery.mark_joined``.)"""
    global recoveries
    before = env.env_rank()
    started = time.monotonic()
    _settle_device_copies()
    _enter(word)
    layouts = sys.modules.get("launchers.elastic.ddp_layouts")
    if layouts is not None:
        layouts.forget_models()  # the next call's DDP models are numbered as in a fresh process
    _forget_framework_state()
    progress.reopen()  # the next report writes a new progress file, of the new attempt
    rank_segment.reopen()  # the next stage writes a new segment, of the new attempt
    if "torch" in sys.modules and _cuda_initialized():
        gc.collect()  # the old model's device memory goes before the new one is built
    recoveries += 1
    rank = env.env_rank()
    recovery.mark_joined()  # its go taken, out of its old call: mlaunch no longer judges it left behind
    newer = _wait_for_rank0_store(word.attempt)
    if newer is not None:
        collective.say(f"attempt {word.attempt} was superseded while this process joined it: joining the next")
        return newer
    moved = f" (was rank {before})" if before != rank else ""
    collective.say(
        f"recovering in place for attempt {word.attempt}: rank {rank}{moved} of {env.env_world()}, "
        f"this process kept ({(time.monotonic() - started) * 1000:.0f} ms to rejoin)"
    )
    return None


def _enter(word: recovery.Word) -> None:
    """This process's environment becomes the next attempt's: one step against the watcher's answer to a hold (a
    hold of the attempt left behind is answered before it, or seen as stale after it)."""
    with _Watcher.lock:
        os.environ.update(word.env)


def _forget_framework_state() -> None:
    """Accelerate keeps the process group's facts process-wide (``PartialState``: rank, world size, device;
    ``AcceleratorState``, ``GradientState``), shared by every ``Accelerator`` made in the process: the next
    call's ``Accelerator()`` would take the failed attempt's rank and world and never initialise the new
    group. Forgotten here, as in a fresh process (Accelerate's own test helpers reset them the same way);
    the HF ``Trainer`` builds on it. DeepSpeed keeps its communication backend (``deepspeed.comm``'s ``cdb``)
    and every group it made (``deepspeed.utils.groups``) in module globals: the next ``deepspeed.initialize``
    broadcast over the destroyed world group ("Group ... is not registered"). Emptied the same way."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
    comm, groups = sys.modules.get("deepspeed.comm.comm"), sys.modules.get("deepspeed.utils.groups")
    if comm is not None:
        vars(comm)["cdb"] = None  # as in a fresh process: the next init_distributed makes a new one
    for name, value in vars(groups).items() if groups is not None else ():
        if name in DEEPSPEED_GROUPS:  # DeepSpeed 0.19's: a dict per group kind, or one group
            setattr(groups, name, {} if isinstance(value, dict) else None)


DEEPSPEED_GROUPS = frozenset(
    ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP")
    + ("_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_WORLD_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP", "mpu")
    + ("_ALL_TO_ALL_GROUP", "mesh_device", "_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP")
    + ("_DATA_PARALLEL_GROUP", "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK")
)


# The most a rejoining rank waits for rank 0's new store before it calls the function anyway. Longer than
# mlaunch takes to replace a survivor that never leaves its call (``run.left_behind.LEAVE_WITHIN``, 8 s) and
# plan the attempt after: when that survivor is rank 0, the others learn that the attempt was superseded while
# they wait here. Called after 5 s, they waited in ``init_process_group``'s store connect, which nothing from
# outside ends, and were replaced too (two hosts, 1 kill in about 800: every rank new, 9.3 s).
STORE_WAIT_SECONDS = 12.0


def _wait_for_rank0_store(joining: int) -> recovery.Word | None:
    """A rank other than 0 waits for rank 0's new store to listen (``ranks.store_wait``), as a warm standby does;
    mlaunch's newer word when ``joining`` was superseded meanwhile (the wait ends at once then).

    The survivors rejoin within milliseconds, usually before rank 0 (a survivor or the replacement) has
    created its store; a refused ``TCPStore`` client retries only after about 0.7 s, which made half the
    in-place recoveries 0.4-0.7 s instead of 0.1 s.
    """
    path = recovery.path_of(env.run_id(), os.getpid())

    def superseded() -> recovery.Word | None:  # a hold of the attempt being joined, or a go past it
        word = recovery.read(path)
        held = word is not None and word.state == recovery.HOLD and word.attempt >= joining
        return word if held or (word is not None and word.state == recovery.GO and word.attempt > joining) else None

    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if host and port.isdigit() and env.env_rank() > 0:
        from launchers.store_wait import wait_for_listener

        wait_for_listener(host, int(port), STORE_WAIT_SECONDS, give_up=lambda: superseded() is not None)
    word = superseded()
    if word is not None and word.state == recovery.HOLD:
        return recovery.await_go(NOTICE_WITHIN, _stop_requested)  # the go that follows the hold (None: a stop)
    return word


def _settle_device_copies() -> None:
    """A device-to-host copy in flight (``ipc.device_stage``) lands before its segment is closed."""
    module = sys.modules.get("launchers.elastic.ipc.device_stage")
    stager = getattr(module, "_stager", None) if module is not None else None
    if stager is not None:
        try:
            stager.wait()
        except Exception as exc:  # noqa: BLE001 - the slot is the agent's now; the copy was best effort
            collective.say(f"waiting for the staged copy in flight: {exc!r} (ignored)")


def _cuda_initialized() -> bool:
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False
