"""The warm parent: one process per node that imported ``preload:`` once and forks every standby from it.

An exec'd standby (``launchers.standby.standby``) pays interpreter start-up and ``import torch``
(seconds of CPU) each time; after a restart four of them competed with the training they
were meant to rescue, and a second fault within those seconds started cold. This process
pays it once per run: it imports the modules, checks that forking it is safe, then waits on
its control socket for requests from mlaunch (``launchers.standby.warm_parent_handle``):

- ``fork`` with four file descriptors (stdin, stdout, stderr, ready pipe), and the device its
  slot's rank will use (``preload_device``; the standby, never this process, initialises CUDA on it): a new standby,
  ready in milliseconds, sharing the imported pages copy-on-write (``gc.freeze()`` keeps the
  collector from touching them). It forks twice, so that the standby is adopted by mlaunch
  (a child subreaper): mlaunch reaps it and gets its exit status like any worker's. The
  standby then takes the parent-death signal (SIGKILL when mlaunch dies), its own session,
  the pipes as fds 0–2 — what a fresh ``subprocess.Popen`` from mlaunch gives a worker — and
  runs the standby protocol (mlaunch's rlimits, signal mask and umask come with the worker).
- ``import`` with module names the ranks were seen to import (``preload_learning``): imported
  here for the next standbys; the reply says which were new and the new module list.

Forking is unsafe when a module starts a thread at import (the child would hold locks
nobody releases) or opens a device: after each import the thread count (/proc/self/task),
``torch.cuda.is_initialized()`` and the open device files are checked, and the first module
that did it is named in the reply; mlaunch then falls back to exec'd standbys.

Messages are JSON, each framed by a 4-byte big-endian length; file descriptors travel with a
``fork`` request as SCM_RIGHTS. EOF on the socket: mlaunch is done, this process exits.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import socket
import struct
import sys
import time
import traceback
from typing import Any

from launchers.prctl import die_with_parent  # here, not in each standby: ctypes is no import of the rank's
from launchers.standby import standby
from launchers.standby.device import DeviceSlot
from launchers.standby.proc_title import take_back_room, without_room

DEVICE_FILES = ("/dev/nvidia", "/dev/davinci", "/dev/dri/", "/dev/accel", "/dev/kfd")
ADOPTION_TIMEOUT = 5.0  # seconds a new standby waits to be adopted by mlaunch before giving up
_LENGTH = struct.Struct(">I")
MAX_FDS = 8


# ----------------------------------------------------------------------------------------
# Framing (both sides use these)
# ----------------------------------------------------------------------------------------


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    frame = _LENGTH.pack(len(data)) + data
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
    sent = sock.sendmsg([frame], ancillary)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def receive_message(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it (blocking); (None, []) at EOF."""
    head, ancillary, _, _ = sock.recvmsg(_LENGTH.size, socket.CMSG_SPACE(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
    if not head:
        return None, fds
    if len(head) < _LENGTH.size:
        rest = _receive_exactly(sock, _LENGTH.size - len(head))
        if rest is None:
            return None, fds
        head += rest
    body = _receive_exactly(sock, _LENGTH.unpack(head)[0])
    return (json.loads(body) if body is not None else None), fds


# ----------------------------------------------------------------------------------------
# Importing, and whether forking stays safe
# ----------------------------------------------------------------------------------------


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def open_device_files() -> list[str]:
    found = []
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith(DEVICE_FILES):
                    found.append(target)
    return found


def fork_hazard(name: str) -> str | None:
    """Why this process may not fork now that ``name`` is imported (None: it may)."""
    threads = thread_count()
    if threads > 1:
        hint = ""
        if "torch" in sys.modules and os.environ.get("OMP_NUM_THREADS") != "1":
            # torch starts its OpenMP pool at import unless OMP_NUM_THREADS=1 (mlaunch sets it with several
            # ranks per node, as torchrun does); a child forked from a process with that pool may hang in it.
            hint = " (torch's OpenMP threads: OMP_NUM_THREADS=1 in job.yaml's env avoids them)"
        return f"importing {name} started {threads - 1} thread(s){hint}"
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    initialized = getattr(cuda, "is_initialized", None)
    if callable(initialized) and initialized():
        return f"importing {name} initialised CUDA"
    devices = open_device_files()
    if devices:
        return f"importing {name} opened the device {devices[0]}"
    return None


def preload(modules: list[str]) -> dict[str, Any]:
    """Import ``preload:``; the first message to mlaunch: ready (with the module list), failed or unsafe."""
    for name in modules:
        try:
            standby.import_preloaded(name)
        except BaseException:  # noqa: BLE001 - any failure is reported, not raised
            return {"failed": name, "error": traceback.format_exc(limit=-3)}
        hazard = fork_hazard(name)
        if hazard:
            return {"unsafe": hazard, "module": name}
    gc.freeze()  # imported objects move to a generation the collector never walks: their pages stay shared
    return {"ready": True, "modules": list(sys.modules)}


def roots_first(modules: list[str]) -> list[str]:
    """``modules`` (in a rank's ``sys.modules`` order) in the order that makes the fewest imports.

    Python moves a module to the end of ``sys.modules`` when its import *completes*, so that
    order lists what a module imported before the module itself (``torch._dynamo`` comes after
    the ~800 modules its import pulled in). Backwards, each import brings the ones before it,
    which are then skipped: what is left to import, and to name to the user, are the roots.
    """
    return list(reversed(modules))


def half_imported(before: set[str]) -> str:
    """What a failed import left in ``sys.modules`` that a fork must not inherit ("" if nothing).

    Python removes the module whose import raised, not the submodules its package imported before
    the error: they stay, orphaned (their package is gone). A later import of the package runs its
    ``__init__`` again, finds them in ``sys.modules`` and never binds them as its attributes: ranks
    forked from such a process failed in DDP's constructor with ``module 'torch._dynamo' has no
    attribute 'utils'``. Modules the failed import completed elsewhere are whole, and harmless.
    """
    orphans = sorted(m for m in set(sys.modules) - before if "." in m and m.rpartition(".")[0] not in sys.modules)
    if not orphans:
        return ""
    shown = ", ".join(orphans[:3]) + (f" and {len(orphans) - 3} more" if len(orphans) > 3 else "")
    return f"{len(orphans)} module(s) whose package is gone ({shown})"


def learn(modules: list[str]) -> dict[str, Any]:
    """Import what the ranks were seen to import, skipping what fails; never from the job's directory."""
    added: list[str] = []
    skipped: dict[str, str] = {}
    before = len(sys.modules)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]  # ``-m`` put the cwd first
    try:
        for name in roots_first(modules):
            if name in sys.modules:
                continue
            known = set(sys.modules)
            try:
                importlib.import_module(name)
            except BaseException as exc:  # noqa: BLE001 - a module that fails here is not preloaded
                why = f"{type(exc).__name__}: {exc}"[:300]
                left = half_imported(known)
                if left:  # this process now holds half-initialised modules: no standby may be forked from it
                    return {"unsafe": f"importing {name} failed half-way ({why}) and left {left}", "module": name,
                            "imported": added, "skipped": skipped}  # fmt: skip
                skipped[name] = why
                continue
            added.append(name)
            hazard = fork_hazard(name)
            if hazard:
                return {"unsafe": hazard, "module": name, "imported": added, "skipped": skipped}
    finally:
        sys.path[:] = saved
    gc.freeze()
    return {"imported": added, "skipped": skipped, "modules": list(sys.modules), "count": len(sys.modules) - before}


# ----------------------------------------------------------------------------------------
# Forking a standby
# ----------------------------------------------------------------------------------------


class ForkedStandby(BaseException):  # noqa: N818 - not an error: it carries the new standby to main()
    """Raised in the new standby process only, so that its stack unwinds to ``main`` before it runs."""

    def __init__(self, fds: list[int], request: dict[str, Any]) -> None:
        super().__init__()
        self.fds = fds
        self.request = request


def fork_standby(sock: socket.socket, fds: list[int], request: dict[str, Any]) -> int:
    """Fork a standby that mlaunch adopts; its pid (-1 when it could not be made)."""
    read_end, write_end = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            _fork_and_leave(write_end)  # returns in the standby only
            os.close(write_end)
        except BaseException:  # noqa: BLE001 - the middle process never returns into the loop
            os._exit(1)
        raise ForkedStandby(fds, request)
    os.close(write_end)
    for fd in fds:
        os.close(fd)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    return int(data) if data.isascii() and data.isdigit() else -1


def _fork_and_leave(write_end: int) -> None:
    """In the middle process: fork the standby, tell the warm parent its pid, exit (the standby returns)."""
    try:
        child = os.fork()
    except BaseException:  # noqa: BLE001
        os._exit(1)
    if child == 0:
        return
    try:
        os.write(write_end, str(child).encode())
    finally:
        os._exit(0)


def become_standby(forked: ForkedStandby, mlaunch: int) -> int:
    """The new standby: adopted by mlaunch, set up as a fresh process of mlaunch's, then the standby protocol.

    mlaunch's rlimits, signal mask and umask come with the worker it becomes (``standby.become``):
    what a process mlaunch starts at that moment would inherit.
    """
    end = time.monotonic() + ADOPTION_TIMEOUT
    while os.getppid() != mlaunch:  # the middle process is exiting: mlaunch (a subreaper) adopts us
        if time.monotonic() > end:
            return 137
        time.sleep(0.0002)
    die_with_parent(signal.SIGKILL)
    if os.getppid() != mlaunch:  # mlaunch died before the parent-death signal was set
        return 137
    os.setsid()
    stdin, stdout, stderr, ready = forked.fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    _fresh_module_state()
    return standby.wait_and_become(ready, DeviceSlot.decode(str(forked.request.get("device") or "")))


def _fresh_module_state() -> None:
    """What a forked process shares with its parent and a fresh interpreter would not have."""
    progress = sys.modules.get("launchers.elastic.ipc.progress")
    if progress is not None:  # its at-fork hook took this process for a data-loader worker
        progress.report_as_new_rank()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # a fresh process seeds numpy's global generator from the OS
        with contextlib.suppress(Exception):
            numpy_random.seed()


# ----------------------------------------------------------------------------------------
# The request loop
# ----------------------------------------------------------------------------------------


def serve(sock: socket.socket) -> None:
    """Answer mlaunch's requests until it closes the socket (or a learned import made forking unsafe)."""
    while True:
        request, fds = receive_message(sock)
        if request is None:
            for fd in fds:
                os.close(fd)
            return
        op = request.get("op")
        if op == "fork" and len(fds) == 4:
            pid = fork_standby(sock, fds, request)  # raises ForkedStandby in the new standby
            send_message(sock, {"forked": pid})
        elif op == "import":
            reply = learn([str(name) for name in request.get("modules", [])])
            send_message(sock, reply)
            if reply.get("unsafe"):
                return
        else:
            for fd in fds:
                os.close(fd)
            send_message(sock, {"error": f"unknown request {op!r}"})


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--control" or not args[1].isdigit():
        sys.stderr.write("usage: python -m launchers.standby.warm_parent --control FD [MODULE ...]\n")
        return 2
    sock = socket.socket(fileno=int(args[1]))
    mlaunch = os.getppid()
    take_back_room()  # ``ps`` shows this process as started, less the room kept for the ranks' command lines
    first = preload(without_room(args[2:]))
    send_message(sock, first)
    if not first.get("ready"):
        return 3
    forked = None
    try:
        serve(sock)
    except ForkedStandby as exc:
        forked = exc.with_traceback(None)
    if forked is None:
        return 0
    # Out of the ``except`` block: the script must not run "during the handling" of ForkedStandby
    # (its exceptions would chain to it, ``sys.exc_info()`` would return it).
    sock.close()
    return become_standby(forked, mlaunch)


if __name__ == "__main__":
    sys.exit(main())
