"""Checking that a parsed rank table adds up: in bulk with sets, O(number of devices); device by device for the message.

Ranks exactly 0..N-1 and unique, device ids unique per server, server ids unique, super pods
disjoint and contiguous in ``server_list``.
"""

from __future__ import annotations

from collections.abc import Mapping

from launchers.platform.ranktable_model import RankTable, RankTableError, Server


def validate(table: RankTable) -> None:
    """Ranks exactly 0..N-1 and unique, devices unique per server, servers unique, super pods sound."""
    path = table.path or "rank table"
    if not table.servers:
        raise RankTableError(f"{path}: server_list is empty; expected at least one server")
    if not _sound(table):
        _find_fault(table, path)
    if table.super_pods:
        server_names = {server.server_id: server.index for server in table.servers}
        _validate_super_pods(table, server_names, path)


def _sound(table: RankTable) -> bool:
    """The whole table's checks in bulk (sets and C loops): a 16,384-server table in a few hundredths of a second."""
    servers = table.servers
    if len({server.server_id for server in servers}) != len(servers):
        return False
    ranks = [dev.rank_id for server in servers for dev in server.devices]
    if len(set(ranks)) != len(ranks) or (ranks and max(ranks) != len(ranks) - 1):
        return False
    return all(s.devices and len({d.device_id for d in s.devices}) == len(s.devices) for s in servers)


def _find_fault(table: RankTable, path: str) -> None:
    """Device by device, the first fault ``_sound`` saw, named: which server, device and rank."""
    rank_owner: dict[int, tuple[Server, str]] = {}  # rank → where (named only for a message: 262,144 at 16k servers)
    server_names: dict[str, int] = {}
    for server in table.servers:
        where = f"{path}: server {server.server_id!r}"
        if server.server_id in server_names:
            raise RankTableError(
                f"{where} appears twice (server_list[{server_names[server.server_id]}] and "
                f"server_list[{server.index}]); server_id must be unique"
            )
        server_names[server.server_id] = server.index
        if not server.devices:
            raise RankTableError(f"{where} lists no devices; expected at least one entry in 'device'")
        device_ids: set[str] = set()
        for dev in server.devices:
            if dev.device_id in device_ids:
                raise RankTableError(f"{where}: device_id {dev.device_id} is listed twice on this server")
            device_ids.add(dev.device_id)
            if dev.rank_id in rank_owner:
                raise RankTableError(
                    f"{path}: rank_id {dev.rank_id} is used twice ({_where(*rank_owner[dev.rank_id])} and "
                    f"{_where(server, dev.device_id)}); rank ids must be unique"
                )
            rank_owner[dev.rank_id] = (server, dev.device_id)
    size = len(rank_owner)
    if size and max(rank_owner) != size - 1:  # unique + max == size-1 + min ≥ 0 ⇒ exactly 0..N-1
        missing = next(r for r in range(size) if r not in rank_owner)
        raise RankTableError(
            f"{path}: rank ids must be exactly 0..{size - 1} for {size} devices, but rank_id {missing} is missing "
            f"and the highest is {max(rank_owner)} ({_where(*rank_owner[max(rank_owner)])})"
        )


def _where(server: Server, device_id: str) -> str:
    return f"server {server.server_id!r} device {device_id}"


def _validate_super_pods(table: RankTable, server_names: Mapping[str, int], path: str) -> None:
    pod_of: dict[str, str] = {}
    pod_ids: set[str] = set()
    for pod in table.super_pods:
        where = f"{path}: super pod {pod.super_pod_id!r}"
        if pod.super_pod_id in pod_ids:
            raise RankTableError(f"{where} is listed twice in super_pod_list; super_pod_id must be unique")
        pod_ids.add(pod.super_pod_id)
        if not pod.server_ids:
            raise RankTableError(f"{where} lists no servers")
        indices = []
        for sid in pod.server_ids:
            if sid not in server_names:
                raise RankTableError(f"{where} names server {sid!r}, which is not in the top-level server_list")
            if sid in pod_of:
                raise RankTableError(f"{where} names server {sid!r}, which is already in super pod {pod_of[sid]!r}")
            pod_of[sid] = pod.super_pod_id
            indices.append(server_names[sid])
        indices.sort()
        if indices[-1] - indices[0] != len(indices) - 1:
            gap = next(i for i in range(indices[0], indices[-1]) if i not in set(indices))
            raise RankTableError(
                f"{where}: its servers must be contiguous in server_list, but server_list[{gap}] "
                f"({table.servers[gap].server_id!r}) sits between them"
            )
