"""The rank table as data: servers, their devices and ranks, super pods; written back as HCCL reads it."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from launchers.errors import PlatformError

SUPPORTED_VERSIONS = ("1.0", "1.2")
STATUS_READY = "completed"
STATUS_WAIT = "initializing"


class RankTableError(PlatformError):
    """The rank table is unreadable, malformed, or does not add up."""


@dataclass(slots=True)
class Device:
    device_id: str  # physical chip id on its server
    rank_id: int
    device_ip: str | None = None
    super_device_id: str | None = None


@dataclass(slots=True)
class Server:
    index: int  # position in server_list
    server_id: str
    devices: list[Device]
    host_ip: str | None = None
    container_ip: str | None = None

    @property
    def rank_start(self) -> int:
        """First (lowest) global rank on this server: davincirun's RANK_START."""
        return min(d.rank_id for d in self.devices)

    def names(self) -> list[str]:
        """Every name this server may be known by (server_id, host_ip, container_ip)."""
        return [n for n in (self.server_id, self.host_ip, self.container_ip) if n]


@dataclass
class SuperPod:
    super_pod_id: str
    server_ids: list[str]


@dataclass
class RankTable:
    version: str
    status: str
    servers: list[Server]
    super_pods: list[SuperPod] = field(default_factory=list)
    source_format: str = "1.0"  # "1.0", "1.2" or "legacy"
    path: str = ""

    @property
    def rank_size(self) -> int:
        return sum(len(s.devices) for s in self.servers)

    def server_of_rank(self, rank: int) -> tuple[Server, int] | None:
        """(server, local index) holding global ``rank``, or None."""
        for server in self.servers:
            for local, dev in enumerate(server.devices):
                if dev.rank_id == rank:
                    return server, local
        return None

    def to_json(self) -> dict[str, Any]:
        """The table in its own version's layout, every value a string (what HCCL reads)."""
        servers = []
        for s in self.servers:
            devices = []
            for d in s.devices:
                entry = {"device_id": d.device_id}
                if d.device_ip is not None:
                    entry["device_ip"] = d.device_ip
                if d.super_device_id is not None:
                    entry["super_device_id"] = d.super_device_id
                entry["rank_id"] = str(d.rank_id)
                devices.append(entry)
            server: dict[str, Any] = {"server_id": s.server_id}
            if s.host_ip:
                server["host_ip"] = s.host_ip
            if s.container_ip:
                server["container_ip"] = s.container_ip
            server["device"] = devices
            server["host_nic_ip"] = "reserve"
            servers.append(server)
        data: dict[str, Any] = {
            "version": self.version,
            "server_count": str(len(self.servers)),
            "server_list": servers,
            "status": self.status,
        }
        if self.super_pods:
            data["super_pod_list"] = [
                {"super_pod_id": p.super_pod_id, "server_list": [{"server_id": sid} for sid in p.server_ids]}
                for p in self.super_pods
            ]
        return data


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """A 65,536-device table makes ~200k acyclic objects; the cycle collector would rescan them over and over."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
