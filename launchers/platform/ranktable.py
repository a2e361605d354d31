"""Ascend rank tables (RANK_TABLE_FILE / hccl.json): read, validate, convert, generate, find this server.

Formats read (platform_spec.md §1):
- version ``"1.0"``: ``server_list[].device[]`` with ``device_id``/``device_ip``/``rank_id``;
- version ``"1.2"`` (SuperPoD): adds ``super_device_id`` per device and ``super_pod_list``;
- the legacy ModelArts/CCE ``group_list``/``instance_list`` form (no ``rank_id``), converted to
  1.0 by sorting instances by the numeric suffix of ``pod_name`` and numbering devices in order.

Every value may be a JSON string or number (``rank_id`` is an int in tables merged by
MindSpore's ``merge_hccl.py``); generated tables use strings, as HCCL's own examples do.

Validation is one pass with sets (O(number of devices)), so a 4096-server × 16-device table
(65,536 ranks) loads in well under a second. Every error names the server, device and field,
and is a ``PlatformError`` (exit 2).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
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


# ----------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------


def _text(value: Any, where: str, name: str, *, required: bool = True) -> str | None:
    if value is None:
        if required:
            raise RankTableError(f"{where}: field {name!r} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RankTableError(f"{where}: field {name!r} is {value!r}; expected a string or a whole number")
    text = str(value).strip()
    if required and not text:
        raise RankTableError(f"{where}: field {name!r} is empty")
    return text


def _integer(value: Any, where: str, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    elif value is None:
        raise RankTableError(f"{where}: field {name!r} is missing")
    else:
        raise RankTableError(f"{where}: field {name!r} is {value!r}; expected a whole number ≥ 0 (string or int)")
    if number < 0:
        raise RankTableError(f"{where}: field {name!r} is {number}; expected a whole number ≥ 0")
    return number


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RankTableError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str, name: str) -> list[Any]:
    if value is None:
        raise RankTableError(f"{where}: field {name!r} is missing")
    if not isinstance(value, list):
        raise RankTableError(f"{where}: field {name!r} must be a list, got {type(value).__name__}")
    return value


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


def parse_rank_table(data: Any, path: str = "rank table") -> RankTable:
    """Any supported format → a validated ``RankTable`` (legacy input is converted to 1.0)."""
    with gc_paused():
        return _parse_rank_table(data, path)


def _parse_rank_table(data: Any, path: str) -> RankTable:
    top = _mapping(data, path)
    status = _text(top.get("status"), path, "status")
    assert status is not None
    if status not in (STATUS_READY, STATUS_WAIT):
        raise RankTableError(
            f"{path}: status is {status!r}; expected {STATUS_READY!r} (or {STATUS_WAIT!r} while it is written)"
        )
    if "group_list" in top and "server_list" not in top:
        table = _parse_legacy(top, path, status)
    else:
        table = _parse_v1(top, path, status)
    validate(table)
    return table


def _parse_v1(top: Mapping[str, Any], path: str, status: str) -> RankTable:
    version = _text(top.get("version"), path, "version")
    assert version is not None
    if version not in SUPPORTED_VERSIONS:
        raise RankTableError(
            f"{path}: version {version!r} is not supported; expected one of {', '.join(SUPPORTED_VERSIONS)} "
            "(or the legacy group_list form)"
        )
    raw_servers = _list(top.get("server_list"), path, "server_list")
    servers: list[Server] = []
    for index, raw in enumerate(raw_servers):
        where = f"{path}: server_list[{index}]"
        entry = _mapping(raw, where)
        server_id = _text(entry.get("server_id"), where, "server_id")
        assert server_id is not None
        where = f"{path}: server {server_id!r} (server_list[{index}])"
        raw_devices = _list(entry.get("device"), where, "device")
        devices = []
        for d_index, raw_dev in enumerate(raw_devices):
            d_where = f"{where}, device[{d_index}]"
            dev = _mapping(raw_dev, d_where)
            device_id = str(_integer(dev.get("device_id"), d_where, "device_id"))
            d_where = f"{where}, device {device_id}"
            devices.append(
                Device(
                    device_id=device_id,
                    rank_id=_integer(dev.get("rank_id"), d_where, "rank_id"),
                    device_ip=_text(dev.get("device_ip"), d_where, "device_ip", required=False),
                    super_device_id=_text(dev.get("super_device_id"), d_where, "super_device_id", required=False),
                )
            )
        servers.append(
            Server(
                index=index,
                server_id=server_id,
                devices=devices,
                host_ip=_text(entry.get("host_ip"), where, "host_ip", required=False),
                container_ip=_text(entry.get("container_ip"), where, "container_ip", required=False),
            )
        )
    if "server_count" in top:
        count = _integer(top.get("server_count"), path, "server_count")
        if count != len(servers):
            raise RankTableError(
                f"{path}: server_count is {count} but server_list has {len(servers)} servers; they must match"
            )
    super_pods: list[SuperPod] = []
    if top.get("super_pod_list") is not None:
        for p_index, raw_pod in enumerate(_list(top.get("super_pod_list"), path, "super_pod_list")):
            where = f"{path}: super_pod_list[{p_index}]"
            pod = _mapping(raw_pod, where)
            pod_id = _text(pod.get("super_pod_id"), where, "super_pod_id")
            assert pod_id is not None
            where = f"{path}: super pod {pod_id!r}"
            ids = []
            for s_index, raw_ref in enumerate(_list(pod.get("server_list"), where, "server_list")):
                ref = _mapping(raw_ref, f"{where}, server_list[{s_index}]")
                sid = _text(ref.get("server_id"), f"{where}, server_list[{s_index}]", "server_id")
                assert sid is not None
                ids.append(sid)
            super_pods.append(SuperPod(pod_id, ids))
    return RankTable(version, status, servers, super_pods, source_format=version, path=path)


_SUFFIX = re.compile(r"(\d+)$")


def _pod_order(pod_name: str, where: str) -> int:
    match = _SUFFIX.search(pod_name)
    if not match:
        raise RankTableError(f"{where}: pod_name {pod_name!r} does not end in a number; expected e.g. 'job-worker-0'")
    return int(match.group(1))


def _parse_legacy(top: Mapping[str, Any], path: str, status: str) -> RankTable:
    """group_list/instance_list → 1.0: instances by pod-name suffix, devices numbered in order."""
    instances: list[tuple[int, str, Mapping[str, Any]]] = []
    for g_index, raw_group in enumerate(_list(top.get("group_list"), path, "group_list")):
        group = _mapping(raw_group, f"{path}: group_list[{g_index}]")
        g_where = f"{path}: group {group.get('group_name', g_index)!r}"
        for i_index, raw_inst in enumerate(_list(group.get("instance_list"), g_where, "instance_list")):
            where = f"{g_where}, instance_list[{i_index}]"
            inst = _mapping(raw_inst, where)
            pod_name = _text(inst.get("pod_name"), where, "pod_name")
            assert pod_name is not None
            instances.append((_pod_order(pod_name, f"{where} (pod {pod_name!r})"), pod_name, inst))
    instances.sort(key=lambda item: item[0])
    seen_pods: dict[int, str] = {}
    servers: list[Server] = []
    rank = 0
    for order, pod_name, inst in instances:
        where = f"{path}: pod {pod_name!r}"
        if order in seen_pods:
            raise RankTableError(
                f"{where}: pod-name number {order} is also used by pod {seen_pods[order]!r}; "
                "ranks are numbered by that suffix, so it must be unique"
            )
        seen_pods[order] = pod_name
        server_id = _text(inst.get("server_id"), where, "server_id")
        assert server_id is not None
        devices = []
        for d_index, raw_dev in enumerate(_list(inst.get("devices"), where, "devices")):
            d_where = f"{where}, devices[{d_index}]"
            dev = _mapping(raw_dev, d_where)
            devices.append(
                Device(
                    device_id=str(_integer(dev.get("device_id"), d_where, "device_id")),
                    rank_id=rank,
                    device_ip=_text(dev.get("device_ip"), d_where, "device_ip", required=False),
                )
            )
            rank += 1
        servers.append(Server(index=len(servers), server_id=server_id, devices=devices))
    return RankTable("1.0", status, servers, source_format="legacy", path=path)


# ----------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------


def validate(table: RankTable) -> None:
    """Ranks exactly 0..N-1 and unique, devices unique per server, servers unique, super pods sound."""
    path = table.path or "rank table"
    if not table.servers:
        raise RankTableError(f"{path}: server_list is empty; expected at least one server")
    rank_owner: dict[int, str] = {}
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
            here = f"server {server.server_id!r} device {dev.device_id}"
            if dev.rank_id in rank_owner:
                raise RankTableError(
                    f"{path}: rank_id {dev.rank_id} is used twice ({rank_owner[dev.rank_id]} and {here}); "
                    "rank ids must be unique"
                )
            rank_owner[dev.rank_id] = here
    size = len(rank_owner)
    if size and max(rank_owner) != size - 1:  # unique + max == size-1 + min ≥ 0 ⇒ exactly 0..N-1
        missing = next(r for r in range(size) if r not in rank_owner)
        raise RankTableError(
            f"{path}: rank ids must be exactly 0..{size - 1} for {size} devices, but rank_id {missing} is missing "
            f"and the highest is {max(rank_owner)} ({rank_owner[max(rank_owner)]})"
        )
    if table.super_pods:
        _validate_super_pods(table, server_names, path)


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


# ----------------------------------------------------------------------------------------
# Loading (with the wait for 'initializing')
# ----------------------------------------------------------------------------------------


def read_rank_table_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RankTableError(f"rank table {path} does not exist") from None
    except IsADirectoryError:
        raise RankTableError(f"rank table {path} is a directory; expected the hccl.json file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RankTableError(f"cannot read rank table {path}: {exc}") from None
    try:
        with gc_paused():
            return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RankTableError(f"rank table {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None


def load_rank_table(
    path: str | Path,
    *,
    wait_timeout: float = 600.0,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[str], None] | None = None,
) -> RankTable:
    """Read and validate the table, polling while its status is 'initializing' (up to ``wait_timeout``).

    A file caught half-written (invalid JSON) is re-read until the same deadline, since the
    platform may be replacing it; any other problem fails at once.
    """
    file = Path(path)
    start = clock()
    deadline = start + wait_timeout
    json_deadline = start + min(wait_timeout, 5.0)  # a half-written file settles quickly; a broken one never
    announced = False
    while True:
        try:
            data = read_rank_table_json(file)
        except RankTableError as exc:
            if "is not valid JSON" not in str(exc) or clock() >= json_deadline:
                raise
            problem = str(exc)
        else:
            status = data.get("status") if isinstance(data, dict) else None
            if status != STATUS_WAIT:
                return parse_rank_table(data, str(file))
            problem = f"its status is still {STATUS_WAIT!r}"
        if clock() >= deadline:
            raise RankTableError(
                f"rank table {file} was not ready after waiting {wait_timeout:g}s ({problem}); "
                "expected status 'completed'. Raise ascend.wait_timeout if the platform is slow to write it"
            )
        if on_wait and not announced:
            on_wait(f"rank table {file}: {problem}; waiting up to {wait_timeout:g}s for 'completed'")
        announced = True
        sleep(max(0.0, min(poll, deadline - clock())))


def write_rank_table(data: Mapping[str, Any], path: str | Path) -> Path:
    """Write atomically (temp file + rename): concurrent per-device copies may write the same file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    return target


# ----------------------------------------------------------------------------------------
# Generating (local simulation, benchmarks)
# ----------------------------------------------------------------------------------------


def simulated_server_id(index: int) -> str:
    """Distinct loopback addresses 127.0.0.1, 127.0.0.2, ... (valid IPv4 up to 16M servers)."""
    n = 0x7F000001 + index
    return f"{n >> 24 & 255}.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


def generate_rank_table(servers: int, devices: int, *, status: str = STATUS_READY) -> dict[str, Any]:
    """A version 1.0 table of ``servers`` × ``devices`` (device ids 0..M-1, ranks in server order)."""
    if servers < 1 or devices < 1:
        raise ValueError("a rank table needs at least one server and one device")
    server_list = []
    for s in range(servers):
        server_list.append(
            {
                "server_id": simulated_server_id(s),
                "device": [
                    {
                        "device_id": str(d),
                        "device_ip": f"192.{168 + d % 16}.{s >> 8 & 255}.{s & 255}",
                        "rank_id": str(s * devices + d),
                    }
                    for d in range(devices)
                ],
                "host_nic_ip": "reserve",
            }
        )
    return {"version": "1.0", "server_count": str(servers), "server_list": server_list, "status": status}


# ----------------------------------------------------------------------------------------
# Which server is this?
# ----------------------------------------------------------------------------------------


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
