"""FAKE manager API: validates the config like the real one documents it, records, optionally blocks."""

from __future__ import annotations

import os
import time
from typing import Any

from taskd._record import record

_initialised = False


def init_taskd_manager(config: dict[str, Any]) -> bool:
    global _initialised
    ok = (
        isinstance(config, dict)
        and isinstance(config.get("job_id"), str)
        and bool(config["job_id"])
        and isinstance(config.get("node_nums"), int)
        and isinstance(config.get("proc_per_node"), int)
    )
    record("init_taskd_manager", config=config, ok=ok, ld_preload=os.environ.get("LD_PRELOAD", ""))
    _initialised = ok
    return ok


def start_taskd_manager() -> bool:
    record("start_taskd_manager", ok=_initialised)
    if not _initialised:
        return False
    if os.environ.get("FAKE_TASKD_MANAGER_BLOCKS") == "1":
        while True:
            time.sleep(3600)
    return True
