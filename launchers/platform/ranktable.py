"""Ascend rank tables (RANK_TABLE_FILE / hccl.json): read, validate, convert, generate, find this server.

Formats read (platform_spec.md §1):
- version ``"1.0"``: ``server_list[].device[]`` with ``device_id``/``device_ip``/``rank_id``;
- version ``"1.2"`` (SuperPoD): adds ``super_device_id`` per device and ``super_pod_list``;
- the legacy ModelArts/CCE ``group_list``/``instance_list`` form (no ``rank_id``), converted to
  1.0 by sorting instances by the numeric suffix of ``pod_name`` and numbering devices in order.

Every value may be a JSON string or number (``rank_id`` is an int in tables merged by
MindSpore's ``merge_hccl.py``); generated tables use strings, as HCCL's own examples do.

Parsing and validation work in bulk per server (C loops over the devices, sets), so a
16,384-server × 16-device table (262,144 ranks, 20 MB) loads, validates and plans a node in
under a second (``benchmarks/plan_scale.py``); up to 1,048,576 ranks are accepted. Every
error names the server, device and field, and is a ``PlatformError`` (exit 2).

This module is the import point for what the engines and tools use; the work is done in
``ranktable_model`` (the data), ``ranktable_parse`` (the versions), ``ranktable_validate``,
``ranktable_files`` (read, wait, write, generate) and ``ranktable_lookup`` (which server is
this machine).
"""

from __future__ import annotations

from launchers.platform.ranktable_files import (
    generate_rank_table,
    load_rank_table,
    read_rank_table_json,
    simulated_server_id,
    write_rank_table,
)
from launchers.platform.ranktable_lookup import find_this_server
from launchers.platform.ranktable_model import RankTable, RankTableError, Server, gc_paused
from launchers.platform.ranktable_parse import parse_rank_table

__all__ = [
    "RankTable",
    "RankTableError",
    "Server",
    "find_this_server",
    "gc_paused",
    "generate_rank_table",
    "load_rank_table",
    "parse_rank_table",
    "read_rank_table_json",
    "simulated_server_id",
    "write_rank_table",
]
