"""The job's own sshd on each node: generated config, started as a daemon, stopped by its PidFile.

Why a daemon and not a supervised process: mlaunch's supervisor reaps every child with
``waitpid(-1)`` while it runs, so nothing may hold a ``Popen`` across it. sshd daemonises
itself (no ``-D``), writes its PidFile, and the engine's cleanup stops it — together with
every session it still serves (an ``orted`` and the ranks node 0's mpirun started here),
so a node that stops leaves nothing behind.

The config (``templates/sshd_config.j2``) allows exactly one thing: the job's user logging
in with the job's key. No password, no keyboard-interactive, no PAM, no forwarding, a
job-wide host key, and it listens only on this node's own address when that is known.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from bootstrap.keys import make_private_dir, write_private
from bootstrap.runtime import NodeFiles

PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd exits 255 without it
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")


class SshdError(RuntimeError):
    """sshd could not be started; the message carries the reason and the tail of its log."""


def sshd_binary() -> str | None:
    """Absolute path of sshd (it refuses to re-exec itself from a relative one)."""
    found = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin")
    return os.path.abspath(found) if found else None


def current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def local_addresses_of(host: str) -> list[str]:
    """The addresses ``host`` resolves to that belong to this machine (bindable), in order.

    Listening only there keeps sshd off every other interface. An unresolvable name or one
    that points elsewhere gives an empty list; the caller then listens on all addresses.
    """
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    found: list[str] = []
    for family, _, _, _, sockaddr in infos:
        address = str(sockaddr[0])
        if address in found or ipaddress.ip_address(address).is_loopback:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                continue
        found.append(address)
    return found


def listen_addresses(host: str | None) -> list[str]:
    """ListenAddress lines for this node: its own address(es), else every address."""
    if host:
        own = local_addresses_of(host)
        if own:
            return own
    return ["0.0.0.0"]


def render_config(files: NodeFiles, port: int, listen: list[str], user: str) -> str:
    from launchers.templating import render

    if not _USER.match(user):
        raise SshdError(f"user name {user!r} cannot be written into an sshd config")
    return render("sshd_config.j2", files=files, port=port, listen=listen, user=user, max_startups="100:30:400")


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() else None


def _is_our_sshd(pid: int, files: NodeFiles) -> bool:
    # A daemonised sshd retitles itself ("sshd: /usr/sbin/sshd -f CONFIG ... [listener] ..."),
    # so look for the binary's name and our config path anywhere in its command line.
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"sshd" in cmdline and str(files.sshd_config).encode() in cmdline


def start(files: NodeFiles, port: int, listen: list[str], *, timeout: float = 10.0) -> int:
    """Write the config, start sshd as a daemon, and return its pid once it listens."""
    binary = sshd_binary()
    if binary is None:
        raise SshdError("sshd is not installed (Debian/Ubuntu: apt-get install openssh-server)")
    stop(files)  # a daemon left by an earlier attempt or a killed mlaunch
    if os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    make_private_dir(files.dir)
    write_private(files.sshd_config, render_config(files, port, listen, current_user()).encode())
    with contextlib.suppress(FileNotFoundError):
        files.sshd_pid.unlink()
    result = subprocess.run(
        [binary, "-f", str(files.sshd_config), "-E", str(files.sshd_log)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise SshdError(f"sshd refused to start (exit {result.returncode}): {_why(result.stderr, files)}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _read_pid(files.sshd_pid)
        if pid and _alive(pid):
            return pid
        time.sleep(0.01)
    raise SshdError(f"sshd did not write {files.sshd_pid} within {timeout:g}s: {_why('', files)}")


def _why(stderr: str, files: NodeFiles) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    with contextlib.suppress(OSError):
        lines += files.sshd_log.read_text(errors="replace").splitlines()[-5:]
    return " | ".join(lines[-6:]) or "no message"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(procs: list[Any], timeout: float) -> list[Any]:
    """Wait until every process has exited; a zombie counts as gone (its reaper may be slow
    — the daemon's parent is init or mlaunch, not us); return the ones still running."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.01)


def stop(files: NodeFiles, *, grace: float = 2.0) -> bool:
    """Stop the daemon named by the PidFile and every session it serves; True if one was running."""
    pid = _read_pid(files.sshd_pid)
    if pid is None or not _alive(pid) or not _is_our_sshd(pid, files):
        with contextlib.suppress(FileNotFoundError):
            files.sshd_pid.unlink()  # stale: the daemon is gone (the supervisor reaps adopted orphans too)
        return False
    import psutil

    try:
        daemon = psutil.Process(pid)
        family = [daemon, *daemon.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in family:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    alive = _wait_gone(family, grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _wait_gone(alive, grace)
    with contextlib.suppress(FileNotFoundError):
        files.sshd_pid.unlink()
    return True
