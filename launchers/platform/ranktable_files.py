"""Rank table files: read (waiting while the platform writes one), write atomically, generate one to simulate."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from launchers.atomic import write_atomic
from launchers.config.limits import MAX_JSON_BYTES
from launchers.config.textfile import read_text
from launchers.platform.numbers import parse_json
from launchers.platform.ranktable_model import STATUS_READY, STATUS_WAIT, RankTable, RankTableError, gc_paused
from launchers.platform.ranktable_parse import parse_rank_table


def read_rank_table_json(path: Path) -> Any:
    """The file's JSON; unreadable or invalid JSON is a ``RankTableError`` naming the file."""
    text = read_text(
        path,
        "rank table",
        RankTableError,
        f"rank table {path} is a directory; expected the hccl.json file",
        max_bytes=MAX_JSON_BYTES,
    )
    with gc_paused():
        return parse_json(text, f"rank table {path}", error=RankTableError)


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
    """Write atomically and durably: concurrent per-device copies may write the same file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(target, json.dumps(data, indent=1) + "\n")


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
