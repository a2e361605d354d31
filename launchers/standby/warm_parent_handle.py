"""mlaunch's side of a warm parent (``launchers.standby.warm_parent``): start it, fork standbys, teach it imports.

The warm parent is started like a standby (own session, parent-death signal, the run's
``MLAUNCH_RUN_ID``, watched by the watchdog) with a Unix socket as its only extra file
descriptor and its output on /dev/null (what it has to say comes back as messages). mlaunch
never blocks on it except for a ``fork`` reply (milliseconds); the first message (imports
done) and the replies to ``import`` are read without blocking, from the supervisor's loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from typing import Any, Literal

from launchers.procs import start_process
from launchers.standby.device import DeviceSlot
from launchers.standby.proc_title import room_argument
from launchers.standby.warm_parent import send_message

FORK_TIMEOUT = 10.0  # seconds mlaunch waits for a fork's reply (milliseconds, normally)


class ForkedProcess(subprocess.Popen[bytes]):
    """A standby the warm parent forked and mlaunch adopted: the parts of ``Popen`` the supervisor uses.

    ``Popen.__init__`` would start a process, so it is not called; pid, the pipes and
    ``returncode`` are what the supervisor and the pool read, and mlaunch — the process's
    parent since it was adopted — reaps it like any worker.
    """

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int) -> None:  # noqa: D107
        self.args = ["<standby forked by the warm parent>"]
        self.pid = pid
        self.stdin = open(stdin, "wb")  # noqa: SIM115 - owned by this object, like Popen's
        self.stdout = open(stdout, "rb")  # noqa: SIM115
        self.stderr = open(stderr, "rb")  # noqa: SIM115
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


class WarmParent:
    """One warm parent process: its state, the modules it has imported, the standbys it forks."""

    def __init__(self, python: str, popen: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.python = python
        self.popen = popen
        self.sock = sock
        self.state: Literal["starting", "ready", "failed"] = "starting"
        self.reason = ""  # why it failed: names the module when forking was unsafe
        self.unsafe_module: str | None = None
        self.unsafe_learned = False  # the unsafe module was a learned one (not in preload:)
        self.modules: set[str] = set()
        self.learning = False  # an ``import`` request is under way
        self.generation = 0  # bumps with every import that added modules: older idle standbys lack them
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.popen.pid

    @classmethod
    def start(cls, python: str, modules: list[str], env: dict[str, str], cwd: str, parent: int) -> WarmParent:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        control = ["--control", str(theirs.fileno())]
        argv = [python, "-u", "-m", "launchers.standby.warm_parent", *control, *modules, room_argument()]
        try:
            popen = start_process(argv, env, cwd, parent, pass_fds=(theirs.fileno(),), output=subprocess.DEVNULL)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(python, popen, ours)

    # -- messages ----------------------------------------------------------------------
    def poll(self) -> list[dict[str, Any]]:
        """Every message that arrived, applied to this handle's state (without blocking)."""
        ended = False
        while self.state != "failed":
            try:
                chunk = self.sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                ended = True
                break
            self._buffer += chunk
        messages = []
        while len(self._buffer) >= 4:
            size = int.from_bytes(self._buffer[:4], "big")
            if len(self._buffer) < 4 + size:
                break
            messages.append(json.loads(self._buffer[4 : 4 + size]))
            self._buffer = self._buffer[4 + size :]
        for message in messages:
            self._apply(message)
        if ended:
            self._lost()  # after its last words (why it failed), if any
        return messages

    def _apply(self, message: dict[str, Any]) -> None:
        if "ready" in message:
            self.state = "ready"
            self.modules = set(message.get("modules", []))
        elif "failed" in message:
            last = str(message.get("error", "")).strip().splitlines()[-1:] or [""]
            self._fail(f"cannot import {message['failed']}: {last[0]}")
        elif "imported" in message:
            self.learning = False
            self.modules.update(message.get("modules", []))
            if message.get("imported"):
                self.generation += 1
        if message.get("unsafe"):
            self.unsafe_module = str(message.get("module") or "")
            self.unsafe_learned = "imported" in message
            self._fail(str(message["unsafe"]))

    def _fail(self, reason: str) -> None:
        if self.state != "failed":
            self.state, self.reason = "failed", reason
            self.close()

    def _lost(self) -> None:
        code = self.popen.poll()
        self._fail(f"the warm parent exited{f' with code {code}' if code is not None else ''}")

    def wait_news(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds for a message (or the socket's end); ``poll`` reads it."""
        if self.state != "failed":
            with contextlib.suppress(OSError, ValueError):
                select.select([self.sock], [], [], timeout)

    # -- requests ----------------------------------------------------------------------
    def fork(self, device: DeviceSlot | None = None) -> tuple[ForkedProcess, int] | None:
        """A new standby and the read end of its ready pipe (None: the warm parent could not fork one).

        ``device``: the standby initialises CUDA on it once forked (``launchers.standby.device``).
        """
        if self.state != "ready" or self.learning:
            return None
        stdin, stdout, stderr, ready = os.pipe(), os.pipe(), os.pipe(), os.pipe()
        theirs = [stdin[0], stdout[1], stderr[1], ready[1]]
        ours = [stdin[1], stdout[0], stderr[0], ready[0]]
        pid = -1
        try:
            self.sock.settimeout(FORK_TIMEOUT)
            request: dict[str, object] = {"op": "fork"}
            if device is not None:
                request["device"] = device.encode()
            send_message(self.sock, request, theirs)
            pid = self._fork_reply()
        except (OSError, ValueError) as exc:
            self._fail(f"fork request failed: {exc}")
        finally:
            with contextlib.suppress(OSError):
                self.sock.setblocking(False)
            for fd in theirs:
                os.close(fd)
        if pid <= 0:
            for fd in ours:
                os.close(fd)
            return None
        os.set_blocking(ready[0], False)
        return ForkedProcess(pid, stdin[1], stdout[0], stderr[0]), ready[0]

    def _fork_reply(self) -> int:
        end = time.monotonic() + FORK_TIMEOUT
        while time.monotonic() < end:
            select.select([self.sock], [], [], max(0.0, end - time.monotonic()))
            self.sock.setblocking(False)
            for message in self.poll():
                if "forked" in message:
                    return int(message["forked"])
            if self.state == "failed":
                return -1
        self._fail("the warm parent did not answer a fork request")
        return -1

    def learn(self, modules: list[str]) -> bool:
        """Ask the warm parent to import ``modules`` too (the reply comes through ``poll``)."""
        if self.state != "ready" or self.learning or not modules:
            return False
        try:
            self.sock.settimeout(FORK_TIMEOUT)
            send_message(self.sock, {"op": "import", "modules": modules})
        except OSError as exc:
            self._fail(f"import request failed: {exc}")
            return False
        finally:
            with contextlib.suppress(OSError):
                self.sock.setblocking(False)
        self.learning = True
        return True

    def close(self) -> None:
        """Closing its socket ends it; SIGKILL makes sure (it is in its own process group)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            os.killpg(self.popen.pid, signal.SIGKILL)
