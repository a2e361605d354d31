"""A start file that checks what an Ascend rank-table launch gives each process.

HCCL needs real NPUs, so this stands in for training: it reads the rank table the process was
pointed at and checks every variable against it, the way HCCL and MindSpore would use them.
Exit 0 and one "ok" line per rank when everything agrees; exit 1 naming the first mismatch.
"""

import json
import os
import sys


def fail(message: str) -> None:
    print(f"rank {os.environ.get('RANK_ID', '?')}: FAIL: {message}", flush=True)
    sys.exit(1)


def need(name: str) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        fail(f"{name} is not set")
    return value


def main() -> None:
    path = need("RANK_TABLE_FILE")
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    if table.get("status") != "completed" or table.get("version") not in ("1.0", "1.2"):
        fail(f"{path}: status {table.get('status')!r}, version {table.get('version')!r}")
    servers = table["server_list"]
    if int(table["server_count"]) != len(servers):
        fail("server_count does not match server_list")
    total = sum(len(s["device"]) for s in servers)
    if int(need("RANK_SIZE")) != total:
        fail(f"RANK_SIZE={os.environ['RANK_SIZE']} but the table has {total} devices")
    rank = int(need("RANK_ID"))
    where = [(s, i, d) for s in servers for i, d in enumerate(s["device"]) if int(d["rank_id"]) == rank]
    if len(where) != 1:
        fail(f"RANK_ID={rank} appears {len(where)} times in {path}")
    server, index, device = where[0]
    if need("MA_CURRENT_HOST_IP") != server["server_id"]:
        fail(f"MA_CURRENT_HOST_IP={os.environ['MA_CURRENT_HOST_IP']} but rank {rank} is on {server['server_id']}")
    if int(need("ASCEND_DEVICE_ID")) != index:
        fail(f"ASCEND_DEVICE_ID={os.environ['ASCEND_DEVICE_ID']} but rank {rank} is device #{index} of its server")
    if need("DEVICE_ID") not in (device["device_id"], str(index)):
        fail(f"DEVICE_ID={os.environ['DEVICE_ID']} is neither device_id {device['device_id']} nor index {index}")
    start = min(int(d["rank_id"]) for d in server["device"])
    if int(need("RANK_START")) != start:
        fail(f"RANK_START={os.environ['RANK_START']} but the server's first rank is {start}")
    need("JOB_ID")
    leader = need("MLAUNCH_NODE_LEADER")
    if leader != ("1" if index == 0 else "0"):
        fail(f"MLAUNCH_NODE_LEADER={leader} for device #{index}")
    rank_dir = need("MLAUNCH_RANK_DIR")
    if os.path.realpath(os.getcwd()) != os.path.realpath(rank_dir):
        fail(f"working directory {os.getcwd()} is not MLAUNCH_RANK_DIR={rank_dir}")
    with open("env.json", "w", encoding="utf-8") as f:  # what the MindSpore scripts keep as env.log
        json.dump({k: v for k, v in os.environ.items() if k.isupper()}, f, indent=1, sort_keys=True)
    print(
        f"rank {rank} ok: server {server['server_id']} device {device['device_id']} "
        f"(ASCEND_DEVICE_ID {index}) of {total}, leader={leader}",
        flush=True,
    )


if __name__ == "__main__":
    main()
