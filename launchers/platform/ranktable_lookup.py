"""Which server of the rank table is this machine: the only one, ``MA_CURRENT_HOST_IP``, or its own names."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterable, Mapping

from launchers.errors import PlatformError
from launchers.platform.ranktable_model import RankTable, Server


def local_names() -> tuple[set[str], str]:
    """This machine's IP addresses (every interface) and its hostname."""
    addresses: set[str] = set()
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6):
                    addresses.add(entry.address.split("%")[0])
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: fall back to the resolver
        pass
    hostname = socket.gethostname()
    for fqdn in {hostname, socket.getfqdn()}:
        with contextlib.suppress(OSError):
            addresses.update(str(info[4][0]) for info in socket.getaddrinfo(fqdn, None))
    return addresses, hostname


def find_this_server(
    table: RankTable,
    env: Mapping[str, str],
    *,
    names: Callable[[], tuple[set[str], str]] = local_names,
) -> tuple[Server, str]:
    """(this server, how it was found): the only one; ``MA_CURRENT_HOST_IP``; then this machine's names."""
    if len(table.servers) == 1:
        return table.servers[0], "the only server in the table"
    tried: list[str] = []
    current = env.get("MA_CURRENT_HOST_IP", "").strip()
    if current:
        found = _match(table.servers, {current})
        if found is not None:
            return found, f"MA_CURRENT_HOST_IP={current}"
        tried.append(f"MA_CURRENT_HOST_IP={current} (no server has that server_id/host_ip/container_ip)")
    else:
        tried.append("MA_CURRENT_HOST_IP (not set)")
    addresses, hostname = names()
    found = _match(table.servers, addresses | {hostname, hostname.split(".")[0]})
    if found is not None:
        return found, f"this machine's address/hostname matches server {found.server_id!r}"
    shown = ", ".join(sorted(addresses)[:8]) + (" ..." if len(addresses) > 8 else "")
    tried.append(f"this machine's addresses ({shown}) and hostname {hostname!r}")
    listed = ", ".join(repr(s.server_id) for s in table.servers[:6]) + (" ..." if len(table.servers) > 6 else "")
    raise PlatformError(
        f"cannot tell which server of rank table {table.path} this machine is (servers: {listed}); tried "
        + "; ".join(tried)
        + ". Set MA_CURRENT_HOST_IP to this server's server_id"
    )


def _match(servers: Iterable[Server], names: set[str]) -> Server | None:
    matches = [s for s in servers if any(n in names for n in s.names())]
    if len(matches) > 1:
        ids = ", ".join(repr(s.server_id) for s in matches)
        raise PlatformError(f"several servers of the rank table match this machine ({ids}); set MA_CURRENT_HOST_IP")
    return matches[0] if matches else None
