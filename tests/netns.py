"""Hosts made of Linux network namespaces, for tests that need several real machines.

Why: MPI over ssh, gloo across hosts and peer readiness only mean something when each
"host" has its own network stack, its own name and its own address. On one machine (root,
CAP_NET_ADMIN/CAP_SYS_ADMIN) that is cheap: ``../shared/reference/test-infrastructure.md``
§2 measured the whole set-up at about 0.2 s.

Topology (nothing touches the root namespace, so only loopback and these addresses carry
traffic):

- a switch namespace ``<prefix>-sw`` holding a bridge;
- per host a namespace ``<prefix>-h<i>`` with ``lo`` up and ``eth0`` (one end of a veth pair
  whose other end is enslaved to the bridge) at ``10.<a>.<b>.<i+1>/24``;
- per host its own UTS hostname and its own ``/etc/hosts`` (bind-mounted over /etc/hosts
  inside the mount namespace ``ip netns exec`` already makes private), listing every host's
  name: distinct hostnames keep Open MPI's shared-memory segments apart and let gloo and
  torch resolve each other like on a real cluster.

Names carry a random suffix per run; ``close()`` (called by the fixture's finalizer, also
on failure) kills every process left in the namespaces and deletes them, which removes the
veths and the bridge too.

Use it as a plain module (``from netns import NetnsHosts``); ``hosts_fixture`` builds the
pytest fixture and skips with a clear reason where ``ip netns add`` is refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launchers.procs import proc_files

IP = shutil.which("ip") or "/usr/sbin/ip"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"

# Enter the host's identity: own UTS namespace, its hostname, its /etc/hosts, then exec.
_IDENTITY = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], text=True, capture_output=True, check=check, timeout=30)


def netns_unavailable_reason() -> str | None:
    """None when this machine lets us create network namespaces, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "network-namespace hosts need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    if not os.path.exists(IP) or not os.path.exists(UNSHARE):
        return "network-namespace hosts need iproute2 (ip) and util-linux (unshare)"
    probe = f"mlprobe-{secrets.token_hex(3)}"
    result = _ip("netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"`ip netns add` was refused here: {result.stderr.strip() or result.returncode}"
    _ip("netns", "delete", probe, check=False)
    return None


@dataclass
class Host:
    """One namespace host: run commands inside it as if on that machine."""

    index: int
    name: str  # the name other hosts use (may be a FQDN such as job-worker-1.job)
    hostname: str  # UTS hostname (the short name)
    ns: str
    ip: str
    hosts_file: Path

    def argv(self, command: Sequence[str]) -> list[str]:
        """The argv that runs ``command`` inside this host (netns + UTS + /etc/hosts)."""
        return [
            IP,
            "netns",
            "exec",
            self.ns,
            UNSHARE,
            "--uts",
            "sh",
            "-c",
            _IDENTITY,
            "host-identity",
            str(self.hosts_file),
            self.hostname,
            *command,
        ]

    def popen(
        self, command: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: object
    ) -> subprocess.Popen[str]:
        """Start ``command`` on this host in its own session (so a test can signal it alone)."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("text", True)
        return subprocess.Popen(self.argv(command), env=dict(env) if env is not None else None, **kwargs)  # type: ignore[call-overload]

    def run(
        self, command: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 60, **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("capture_output", True)
        return subprocess.run(  # type: ignore[call-overload]
            self.argv(command), env=dict(env) if env is not None else None, text=True, timeout=timeout, **kwargs
        )

    def pids(self) -> list[int]:
        result = _ip("netns", "pids", self.ns, check=False)
        return [int(p) for p in result.stdout.split() if p.isdigit()]


def default_names(prefix: str, count: int) -> list[tuple[str, str]]:
    """(name, hostname) per host: ModelArts/Volcano style ``<job>-worker-<i>.<job>``."""
    job = f"{prefix}job"
    return [(f"{job}-worker-{i}.{job}", f"{job}-worker-{i}") for i in range(count)]


@dataclass
class NetnsHosts:
    """A set of namespace hosts on one bridge; use as a context manager or call close()."""

    count: int
    names: Callable[[str, int], list[tuple[str, str]]] = default_names
    prefix: str = field(default_factory=lambda: f"ml{secrets.token_hex(3)}")
    hosts: list[Host] = field(default_factory=list)
    _workdir: Path | None = None
    _created: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def __enter__(self) -> NetnsHosts:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> list[Host]:
        clear_killed_pyenv_lock()  # one a killed session left before (``.ci/run`` clears those of other runs)
        net = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        bridge = f"{self.prefix}br"
        _ip("netns", "add", self.switch)
        self._created.append(self.switch)
        _ip("-n", self.switch, "link", "add", bridge, "type", "bridge")
        _ip("-n", self.switch, "link", "set", bridge, "up")
        _ip("-n", self.switch, "link", "set", "lo", "up")
        pairs = self.names(self.prefix, self.count)
        for i, (name, hostname) in enumerate(pairs):
            ns = f"{self.prefix}-h{i}"
            inner, outer = f"{self.prefix}i{i}", f"{self.prefix}o{i}"
            _ip("netns", "add", ns)
            self._created.append(ns)
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", outer, "master", bridge)
            _ip("-n", self.switch, "link", "set", outer, "up")
            _ip("-n", ns, "link", "set", inner, "name", "eth0")
            ip = f"{net}.{i + 1}"
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hosts_file = self._workdir / f"hosts-{i}"
            self.hosts.append(Host(i, name, hostname, ns, ip, hosts_file))
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [f"{h.ip} {h.name} {h.hostname}" if h.name != h.hostname else f"{h.ip} {h.name}" for h in self.hosts]
        for host in self.hosts:
            host.hosts_file.write_text("\n".join(lines) + "\n")
        return self.hosts

    @property
    def workdir(self) -> Path:
        assert self._workdir is not None
        return self._workdir

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process still running in any of the namespaces."""
        for ns in self._created:
            result = _ip("netns", "pids", ns, check=False)
            for pid in (int(p) for p in result.stdout.split() if p.isdigit()):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)

    def close(self) -> None:
        """Kill what is left inside, delete the namespaces (veths and bridge go with them)."""
        if not self._created:
            return
        self.kill_all(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            _ip("netns", "pids", ns, check=False).stdout.split() for ns in self._created
        ):
            time.sleep(0.05)
        for ns in reversed(self._created):
            _ip("netns", "delete", ns, check=False)
        self._created.clear()
        self._remove_mpi_segments()
        clear_killed_pyenv_lock()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def _remove_mpi_segments(self) -> None:
        """Open MPI's shared-memory segments of ranks killed on these hosts (a host that vanishes takes its
        ``/dev/shm`` with it; these hosts share the machine's, so the test does what the platform would)."""
        for host in self.hosts:
            for path in Path("/dev/shm").glob(f"vader_segment.{host.hostname}.*"):
                path.unlink(missing_ok=True)


PYENV_REHASH_LOCK = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "shims" / ".pyenv-shim"


def clear_killed_pyenv_lock() -> None:
    """Remove a ``pyenv rehash`` lock whose rehash was killed.

    Where root's ~/.bashrc runs ``pyenv init`` (this machine's and CI's image), every ssh session into a
    host (Open MPI starting ``orted``) rehashes first, under a lock file its EXIT trap removes. ``close()``
    SIGKILLs whatever runs in the hosts, a rehash too, and the lock stays: every later ssh session then
    waits 60 s for it (CI: four MPI tests ran out of time in a row). Hosts clear it when made and closed,
    only when no ``pyenv-rehash`` runs now and the lock is a few seconds old (a live one takes milliseconds).
    """
    try:
        age = time.time() - PYENV_REHASH_LOCK.stat().st_mtime
    except OSError:
        return
    cmdlines = proc_files("cmdline") or iter(())
    if age >= 5 and not any(b"pyenv-rehash" in cmdline for _, cmdline in cmdlines):
        PYENV_REHASH_LOCK.unlink(missing_ok=True)


def hosts_fixture(count: int) -> Callable[[], Iterator[list[Host]]]:
    """A pytest fixture body yielding ``count`` hosts; skips with the reason when netns is refused."""

    def fixture() -> Iterator[list[Host]]:
        import pytest

        reason = netns_unavailable_reason()
        if reason:
            pytest.skip(reason)
        with NetnsHosts(count) as net:
            yield net.hosts

    return fixture


def communicate_all(procs: Sequence[subprocess.Popen[Any]], timeout: float) -> list[tuple[int, Any, Any]]:
    """(exit code, stdout, stderr) of every process, in order; all are killed if one outlasts ``timeout``."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        results.append((proc.returncode, out, err))
    return results
