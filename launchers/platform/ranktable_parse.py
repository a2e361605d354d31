"""Reading a rank table's JSON: versions 1.0 and 1.2, and the legacy ``group_list`` form (converted to 1.0).

Every value may be a JSON string or number (``rank_id`` is an int in tables merged by
MindSpore's ``merge_hccl.py``). Every error names the server, device and field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from launchers.config.limits import MAX_WORLD_SIZE
from launchers.platform.ranktable_model import (
    STATUS_READY,
    STATUS_WAIT,
    SUPPORTED_VERSIONS,
    Device,
    RankTable,
    RankTableError,
    Server,
    SuperPod,
    gc_paused,
)
from launchers.platform.ranktable_validate import validate


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


def _required(value: Any, where: str, name: str) -> str:
    """A required string field (``_text`` raises rather than return None)."""
    text = _text(value, where, name)
    assert text is not None
    return text


def _keyed(raw: Any, where: str, key: str) -> tuple[Mapping[str, Any], str]:
    """A JSON object and the field that names it (server_id, super_pod_id, pod_name), both required."""
    entry = _mapping(raw, where)
    return entry, _required(entry.get(key), where, key)


_DIGITS = re.compile(r"[0-9]{1,10}")  # ASCII only: "²".isdigit() is True, int("²") fails
_MAX_ID = 2**32 - 1  # device, rank and server ids; super_device_id values are large (37748736)


def _integer(value: Any, where: str, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
    elif value is None:
        raise RankTableError(f"{where}: field {name!r} is missing")
    else:
        shown = repr(value) if len(repr(value)) <= 60 else f"{repr(value)[:40]}... ({len(str(value))} characters)"
        raise RankTableError(f"{where}: field {name!r} is {shown}; expected a whole number ≥ 0 (string or int)")
    if not 0 <= number <= _MAX_ID:
        raise RankTableError(f"{where}: field {name!r} is {number}; expected a whole number from 0 to {_MAX_ID}")
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


def parse_rank_table(data: Any, path: str = "rank table") -> RankTable:
    """Any supported format → a validated ``RankTable`` (legacy input is converted to 1.0)."""
    with gc_paused():
        return _parse_rank_table(data, path)


def _parse_rank_table(data: Any, path: str) -> RankTable:
    top = _mapping(data, path)
    status = _required(top.get("status"), path, "status")
    if status not in (STATUS_READY, STATUS_WAIT):
        raise RankTableError(
            f"{path}: status is {status!r}; expected {STATUS_READY!r} (or {STATUS_WAIT!r} while it is written)"
        )
    if "group_list" in top and "server_list" not in top:
        table = _parse_legacy(top, path, status)
    else:
        table = _parse_v1(top, path, status)
    validate(table)
    if table.rank_size > MAX_WORLD_SIZE:
        raise RankTableError(f"{path}: {table.rank_size} devices; mlaunch runs at most {MAX_WORLD_SIZE} ranks in total")
    return table


def _parse_v1(top: Mapping[str, Any], path: str, status: str) -> RankTable:
    """Version 1.0 or 1.2: ``server_list[].device[]`` with rank ids, and 1.2's ``super_pod_list``."""
    version = _required(top.get("version"), path, "version")
    if version not in SUPPORTED_VERSIONS:
        raise RankTableError(
            f"{path}: version {version!r} is not supported; expected one of {', '.join(SUPPORTED_VERSIONS)} "
            "(or the legacy group_list form)"
        )
    raw_servers = _list(top.get("server_list"), path, "server_list")
    servers = [_parse_server(raw, index, path) for index, raw in enumerate(raw_servers)]
    if "server_count" in top:
        count = _integer(top.get("server_count"), path, "server_count")
        if count != len(servers):
            raise RankTableError(
                f"{path}: server_count is {count} but server_list has {len(servers)} servers; they must match"
            )
    super_pods: list[SuperPod] = []
    if top.get("super_pod_list") is not None:
        raw_pods = _list(top.get("super_pod_list"), path, "super_pod_list")
        super_pods = [_parse_super_pod(raw, index, path) for index, raw in enumerate(raw_pods)]
    return RankTable(version, status, servers, super_pods, source_format=version, path=path)


def _parse_server(raw: Any, index: int, path: str) -> Server:
    """One ``server_list`` entry of a 1.0/1.2 table, with its devices."""
    where = f"{path}: server_list[{index}]"
    entry, server_id = _keyed(raw, where, "server_id")
    where = f"{path}: server {server_id!r} (server_list[{index}])"
    raw_devices = _list(entry.get("device"), where, "device")
    devices = _fast_devices(raw_devices) if raw_devices else []
    if devices is None:
        devices = [_parse_device(raw, f"{where}, device[{i}]", where) for i, raw in enumerate(raw_devices)]
    return Server(
        index=index,
        server_id=server_id,
        devices=devices,
        host_ip=_text(entry.get("host_ip"), where, "host_ip", required=False),
        container_ip=_text(entry.get("container_ip"), where, "container_ip", required=False),
    )


def _parse_device(raw_dev: Any, d_where: str, where: str) -> Device:
    """One device, every field checked and any error naming it."""
    dev = _mapping(raw_dev, d_where)
    device_id = str(_integer(dev.get("device_id"), d_where, "device_id"))
    d_where = f"{where}, device {device_id}"
    return Device(
        device_id=device_id,
        rank_id=_integer(dev.get("rank_id"), d_where, "rank_id"),
        device_ip=_text(dev.get("device_ip"), d_where, "device_ip", required=False),
        super_device_id=_text(dev.get("super_device_id"), d_where, "super_device_id", required=False),
    )


def _fast_devices(raw_devices: list[Any]) -> list[Device] | None:
    """A server's devices in bulk when every field has its common form; None: check each device for its message.

    A 16,384-server table has 262,144 devices: per-field calls cost about a second there. This
    accepts exactly what ``_parse_device`` accepts, the same way (digit strings of at most 10
    characters or ints, optional strings), and leaves anything unusual to it.
    """
    if not all(type(raw) is dict for raw in raw_devices):
        return None
    ids = _fast_ids([raw.get("device_id") for raw in raw_devices])
    ranks = _fast_ids([raw.get("rank_id") for raw in raw_devices])
    ips = _optional_texts([raw.get("device_ip") for raw in raw_devices])
    supers = _optional_texts([raw.get("super_device_id") for raw in raw_devices])
    if ids is None or ranks is None or ips is None or supers is None:
        return None
    return list(map(Device, map(str, ids), ranks, ips, supers))


def _fast_ids(values: list[Any]) -> list[int] | None:
    kinds = set(map(type, values))
    if kinds == {int}:
        numbers = values
    elif kinds == {str} and min(map(len, values)) > 0 and max(map(len, values)) <= 10:
        joined = "".join(values)
        if not (joined.isascii() and joined.isdigit()):
            return None
        numbers = list(map(int, values))
    else:
        return None
    return numbers if min(numbers) >= 0 and max(numbers) <= _MAX_ID else None


def _optional_texts(values: list[Any]) -> list[str | None] | None:
    """Optional text fields, stripped (C loops when all are strings or all absent); None when one is not a string."""
    kinds = set(map(type, values))
    if kinds == {str}:
        return list(map(str.strip, values))
    if kinds <= {type(None)}:
        return values
    if kinds <= {str, type(None)}:
        return [value.strip() if value is not None else None for value in values]
    return None


def _parse_super_pod(raw: Any, index: int, path: str) -> SuperPod:
    """One ``super_pod_list`` entry of a 1.2 table: its id and the server ids it groups."""
    where = f"{path}: super_pod_list[{index}]"
    pod, pod_id = _keyed(raw, where, "super_pod_id")
    where = f"{path}: super pod {pod_id!r}"
    ids = []
    for s_index, raw_ref in enumerate(_list(pod.get("server_list"), where, "server_list")):
        ids.append(_keyed(raw_ref, f"{where}, server_list[{s_index}]", "server_id")[1])
    return SuperPod(pod_id, ids)


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
            inst, pod_name = _keyed(raw_inst, where, "pod_name")
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
        server_id = _required(inst.get("server_id"), where, "server_id")
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
