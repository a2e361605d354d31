"""Two machines for ``control_scale``: node 0's network namespace, and one for every other node, joined by a veth.

Why: on one network stack the successor's hub binds the very address node 0's hub had
(``127.0.0.1:port``), so the agents' old sockets, still reconnecting to the dead hub, reach the
new hub too — twice the handshakes, agents that hear the new hub on their old connection and
find the loss late, members left out and taken back — nothing a real job sees, where node 0's
host refuses the connections once its mlaunch is gone. With node 0 alone in its namespace at
``10.a.b.1``, every other node (the agents, node 1 and its successor hub at ``127.0.0.1``) in
the other at ``10.a.b.2``, the old sockets are refused as on a real cluster.

Needs root (``ip netns``); the conductor stays in the root namespace and its children enter
theirs first thing after the fork (``enter``: ``setns(2)`` before any thread or socket exists).
Nothing touches the root namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

IP = shutil.which("ip") or "/usr/sbin/ip"
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Hosts:
    node0: str  # node 0's namespace
    others: str  # every other node's
    node0_ip: str  # node 0's address, as the others reach it


def _ip(*args: str) -> None:
    subprocess.run([IP, *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def two_hosts() -> Iterator[Hosts | None]:
    """The two namespaces, deleted on the way out; None (and why, printed) where ``ip netns`` is refused."""
    tag = secrets.token_hex(3)
    net = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
    hosts = Hosts(f"mlcs0-{tag}", f"mlcs1-{tag}", f"{net}.1")
    made: list[str] = []
    try:
        for ns in (hosts.node0, hosts.others):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", hosts.node0, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", hosts.others)
        for ns, address in ((hosts.node0, f"{net}.1"), (hosts.others, f"{net}.2")):
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
    except (OSError, subprocess.CalledProcessError) as exc:
        why = exc.stderr.decode().strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        print(f"  no network namespaces here ({why or exc}): node 0's loss is not measured", flush=True)
        for ns in made:
            subprocess.run([IP, "netns", "delete", ns], check=False, capture_output=True)
        yield None
        return
    try:
        yield hosts
    finally:
        for ns in made:
            subprocess.run([IP, "netns", "delete", ns], check=False, capture_output=True)


def enter(ns: str | None) -> None:
    """This process into namespace ``ns`` (None: stay), before it starts a thread or opens a socket."""
    if ns is None:
        return
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)
