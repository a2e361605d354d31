"""Wait until every peer's sshd accepts the job key — all peers at once, one overall deadline.

The seed's script resolved and probed each host in turn, in ``sleep 1`` loops, and only
checked that a TCP port was open. Here each host gets its own thread that resolves the
name, connects, completes a real SSH handshake (paramiko), checks the host key against the
job's pinned key and authenticates with the job's key — exactly what mpirun's ssh will need
a moment later. Retries back off from 50 ms to 1 s, so a peer that comes up is noticed
within a second, and the total time is that of the slowest peer, not the sum of all.

A host presenting another host key, or refusing the job key, fails the wait at once (no
point retrying a security failure); hosts still silent at the deadline are named in the
error with the last problem seen for each.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bootstrap.hosts import resolve
from bootstrap.runtime import HOST_KEY_ALIAS

if TYPE_CHECKING:
    import paramiko

MAX_PARALLEL = 64  # handshakes in flight at once; more hosts than this share the slots
FIRST_RETRY = 0.05
MAX_RETRY = 1.0

logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False  # its banner errors are expected while peers boot


@dataclass
class PeerStatus:
    host: str
    address: str | None = None
    ready: bool = False
    attempts: int = 0
    elapsed: float = 0.0
    error: str = "not tried yet"
    fatal: bool = False


class PeersNotReady(RuntimeError):
    """Some peers never accepted the job key before the deadline (or refused it for good)."""

    def __init__(self, message: str, statuses: dict[str, PeerStatus]) -> None:
        super().__init__(message)
        self.statuses = statuses


class _Fatal(Exception):
    """A failure retrying cannot fix (wrong host key, job key refused)."""


def load_pinned_host_key(known_hosts: Path) -> paramiko.PKey:
    """The job-wide host key, from the pinned known_hosts line ``mlaunch-job <type> <key>``."""
    import paramiko

    keys = paramiko.HostKeys(str(known_hosts)).lookup(HOST_KEY_ALIAS)
    if not keys:
        raise ValueError(f"{known_hosts} has no entry for {HOST_KEY_ALIAS}")
    return next(iter(keys.values()))


def load_client_key(path: Path) -> paramiko.PKey:
    import paramiko

    return paramiko.PKey.from_path(str(path))


def check_once(host: str, port: int, user: str, pkey: paramiko.PKey, host_key: paramiko.PKey, timeout: float) -> str:
    """One real SSH handshake + public-key auth against ``host``; returns the address used."""
    import paramiko

    address = resolve(host)
    sock = socket.create_connection((address, port), timeout=timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = timeout
        transport.handshake_timeout = timeout
        transport.auth_timeout = timeout
        transport.start_client(timeout=timeout)
        offered = transport.get_remote_server_key()
        if offered.get_name() != host_key.get_name() or offered.asbytes() != host_key.asbytes():
            raise _Fatal(
                f"presented host key {offered.get_name()} {offered.fingerprint}, not the job's pinned "
                f"{host_key.get_name()} {host_key.fingerprint} (another sshd on port {port}, or a different job secret)"
            )
        try:
            transport.auth_publickey(user, pkey)
        except paramiko.BadAuthenticationType as exc:
            raise _Fatal(f"does not accept public-key login (allowed: {', '.join(exc.allowed_types)})") from None
        except paramiko.AuthenticationException:
            raise _Fatal(f"refused the job key for user {user!r} (a different job secret?)") from None
        if not transport.is_authenticated():
            raise _Fatal(f"did not authenticate user {user!r} with the job key")
    finally:
        transport.close()
        sock.close()
    return address


@dataclass
class _Watch:
    """One wait for a set of peers: the handshake's credentials, one deadline, the shared slots and flags."""

    port: int
    user: str
    pkey: paramiko.PKey
    host_key: paramiko.PKey
    start: float
    deadline: float
    halt: threading.Event
    on_ready: Callable[[PeerStatus], None] | None = None
    slots: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(MAX_PARALLEL))
    failed: threading.Event = field(default_factory=threading.Event)

    def give_up(self) -> bool:
        return self.failed.is_set() or self.halt.is_set() or time.monotonic() >= self.deadline

    def attempt(self, status: PeerStatus) -> bool:
        """One handshake with ``status.host``; True when there is nothing more to do for it."""
        status.attempts += 1
        attempt_timeout = max(0.5, min(5.0, self.deadline - time.monotonic()))
        try:
            status.address = check_once(status.host, self.port, self.user, self.pkey, self.host_key, attempt_timeout)
        except _Fatal as exc:
            status.error, status.fatal = str(exc), True
            self.failed.set()
            return True
        except Exception as exc:  # noqa: BLE001 - resolution, refused, banner/timeout: retry
            status.error = _describe(exc)
            return False
        status.ready, status.error = True, ""
        status.elapsed = time.monotonic() - self.start
        if self.on_ready:
            self.on_ready(status)
        return True

    def __call__(self, status: PeerStatus) -> None:
        """Retry ``status.host`` with backoff until it is ready, fails for good, or the wait ends."""
        delay = FIRST_RETRY
        while not self.give_up():
            with self.slots:
                if self.give_up() or self.attempt(status):
                    return
            self.halt.wait(min(delay, max(0.0, self.deadline - time.monotonic())))
            delay = min(MAX_RETRY, delay * 1.5)


def wait_for_peers(
    hosts: Sequence[str],
    port: int,
    user: str,
    pkey: paramiko.PKey,
    host_key: paramiko.PKey,
    timeout: float,
    *,
    stop: threading.Event | None = None,
    on_ready: Callable[[PeerStatus], None] | None = None,
) -> dict[str, PeerStatus]:
    """Check every host concurrently until all are ready; raise ``PeersNotReady`` otherwise."""
    start = time.monotonic()
    watch = _Watch(port, user, pkey, host_key, start, start + timeout, stop or threading.Event(), on_ready)
    statuses = {host: PeerStatus(host) for host in dict.fromkeys(hosts)}
    threads = [
        threading.Thread(target=watch, args=(s,), daemon=True, name=f"ready-{s.host}") for s in statuses.values()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.1)
            if watch.halt.is_set():
                break
    _raise_unless_ready(statuses, watch.halt, port, timeout)
    return statuses


def _raise_unless_ready(statuses: dict[str, PeerStatus], halt: threading.Event, port: int, timeout: float) -> None:
    if halt.is_set() and not all(s.ready for s in statuses.values()):
        raise PeersNotReady("stopped while waiting for peers", statuses)
    fatal = [s for s in statuses.values() if s.fatal]
    if fatal:
        detail = "; ".join(f"{s.host}: {s.error}" for s in fatal)
        raise PeersNotReady(f"refused to trust {len(fatal)} host(s): {detail}", statuses)
    missing = [s for s in statuses.values() if not s.ready]
    if missing:
        detail = "; ".join(f"{s.host} ({s.error})" for s in missing)
        raise PeersNotReady(
            f"{len(missing)} of {len(statuses)} host(s) never accepted an ssh login on port {port} within "
            f"{timeout:g}s: {detail}",
            statuses,
        )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"name does not resolve ({exc.strerror})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (sshd not up yet)"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
