"""Rank tables: every format read, every validation rule, the wait for 'initializing', this server.

Tables are hand-written in the shapes of platform_spec.md §1 (MindSpore docs / hccl_tools for
1.0, HCCL user guide / MindCluster for 1.2, ModelArts' jobstart_hccl.json for the legacy form).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from launchers.errors import PlatformError
from launchers.platform.ranktable import (
    RankTableError,
    find_this_server,
    generate_rank_table,
    load_rank_table,
    parse_rank_table,
    simulated_server_id,
    write_rank_table,
)

V10: dict[str, Any] = {
    "version": "1.0",
    "server_count": "2",
    "server_list": [
        {
            "server_id": "10.0.0.1",
            "device": [
                {"device_id": "0", "device_ip": "192.1.27.6", "rank_id": "0"},
                {"device_id": "1", "device_ip": "192.2.27.6", "rank_id": "1"},
            ],
            "host_nic_ip": "reserve",
        },
        {
            "server_id": "10.0.0.2",
            "device": [
                {"device_id": "0", "device_ip": "192.1.27.8", "rank_id": "2"},
                {"device_id": "1", "device_ip": "192.2.27.8", "rank_id": "3"},
            ],
            "host_nic_ip": "reserve",
        },
    ],
    "status": "completed",
}

V12: dict[str, Any] = {
    "status": "completed",
    "version": "1.2",
    "server_count": "3",
    "server_list": [
        {
            "server_id": "node_0",
            "host_ip": "172.16.0.110",
            "device": [
                {"device_id": "0", "device_ip": "192.168.1.8", "super_device_id": "37748736", "rank_id": "0"},
                {"device_id": "1", "device_ip": "192.168.1.9", "super_device_id": "37748737", "rank_id": "1"},
            ],
        },
        {
            "server_id": "node_1",
            "host_ip": "172.16.0.111",
            "device": [{"device_id": "0", "device_ip": "192.168.2.8", "super_device_id": "2", "rank_id": "2"}],
        },
        {
            "server_id": "node_2",
            "host_ip": "172.16.0.112",
            "device": [{"device_id": "0", "device_ip": "192.168.3.8", "super_device_id": "3", "rank_id": "3"}],
        },
    ],
    "super_pod_list": [
        {"super_pod_id": "0", "server_list": [{"server_id": "node_0"}, {"server_id": "node_1"}]},
        {"super_pod_id": "1", "server_list": [{"server_id": "node_2"}]},
    ],
}

# ModelArts/CCE jobstart_hccl.json: no rank_id; pods listed out of order, suffix 10 after 2.
LEGACY: dict[str, Any] = {
    "status": "completed",
    "group_count": "1",
    "group_list": [
        {
            "group_name": "job-worker",
            "device_count": "6",
            "instance_count": "3",
            "instance_list": [
                {
                    "pod_name": "job-worker-10",
                    "server_id": "10.0.0.10",
                    "devices": [
                        {"device_id": "4", "device_ip": "1.0.0.10"},
                        {"device_id": "5", "device_ip": "2.0.0.10"},
                    ],
                },
                {
                    "pod_name": "job-worker-0",
                    "server_id": "10.0.0.1",
                    "devices": [{"device_id": "0", "device_ip": "1.0.0.1"}, {"device_id": "1", "device_ip": "2.0.0.1"}],
                },
                {
                    "pod_name": "job-worker-2",
                    "server_id": "10.0.0.3",
                    "devices": [{"device_id": "0", "device_ip": "1.0.0.3"}, {"device_id": "1", "device_ip": "2.0.0.3"}],
                },
            ],
        }
    ],
}


def table_with(base: dict[str, Any], edit) -> dict[str, Any]:
    data = copy.deepcopy(base)
    edit(data)
    return data


# -- reading ------------------------------------------------------------------------------


def test_v10_strings() -> None:
    table = parse_rank_table(V10, "t.json")
    assert table.version == "1.0" and table.rank_size == 4
    assert [s.server_id for s in table.servers] == ["10.0.0.1", "10.0.0.2"]
    assert [d.rank_id for d in table.servers[1].devices] == [2, 3]
    assert table.servers[1].rank_start == 2
    assert table.servers[0].devices[1].device_ip == "192.2.27.6"


def test_v10_int_rank_ids_as_merge_hccl_writes_them() -> None:
    def ints(d: dict[str, Any]) -> None:
        for server in d["server_list"]:
            for dev in server["device"]:
                dev["rank_id"] = int(dev["rank_id"])
        d["server_count"] = 2

    table = parse_rank_table(table_with(V10, ints))
    assert [d.rank_id for s in table.servers for d in s.devices] == [0, 1, 2, 3]
    assert table.to_json()["server_list"][0]["device"][1]["rank_id"] == "1"  # written back as strings


def test_v12_super_pods() -> None:
    table = parse_rank_table(V12)
    assert table.version == "1.2"
    assert table.servers[0].devices[0].super_device_id == "37748736"
    assert [p.server_ids for p in table.super_pods] == [["node_0", "node_1"], ["node_2"]]
    assert table.to_json()["super_pod_list"][1] == {"super_pod_id": "1", "server_list": [{"server_id": "node_2"}]}


def test_legacy_converted_by_pod_suffix_then_device() -> None:
    table = parse_rank_table(LEGACY, "jobstart_hccl.json")
    assert table.source_format == "legacy" and table.version == "1.0"
    assert [s.server_id for s in table.servers] == ["10.0.0.1", "10.0.0.3", "10.0.0.10"]
    assert [(d.device_id, d.rank_id) for d in table.servers[2].devices] == [("4", 4), ("5", 5)]
    converted = table.to_json()
    assert converted["version"] == "1.0" and converted["server_count"] == "3"
    assert parse_rank_table(converted).rank_size == 6  # the converted file reads back as a valid 1.0 table


def test_legacy_duplicate_pod_suffix_is_an_error() -> None:
    def dup(d: dict[str, Any]) -> None:
        d["group_list"][0]["instance_list"][2]["pod_name"] = "other-worker-10"

    with pytest.raises(RankTableError, match=r"pod-name number 10 is also used by pod 'job-worker-10'"):
        parse_rank_table(table_with(LEGACY, dup))


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["server_list"][1]["device"][0].update(rank_id="1"), r"rank_id 1 is used twice .*'10\.0\.0\.2'"),
        (lambda d: d["server_list"][1]["device"][1].update(rank_id="7"), r"rank_id 3 is missing"),
        (
            lambda d: d["server_list"][0]["device"][1].update(device_id="0"),
            r"'10\.0\.0\.1'.*device_id 0 is listed twice",
        ),
        (lambda d: d.update(server_count="3"), r"server_count is 3 but server_list has 2"),
        (lambda d: d["server_list"][1].update(server_id="10.0.0.1"), r"'10\.0\.0\.1' appears twice"),
        (
            lambda d: d["server_list"][0]["device"][0].pop("rank_id"),
            r"'10\.0\.0\.1'.*device 0: field 'rank_id' is missing",
        ),
        (lambda d: d["server_list"][0]["device"][0].update(rank_id="x"), r"field 'rank_id' is 'x'; expected a whole"),
        (lambda d: d["server_list"][1].update(device=[]), r"'10\.0\.0\.2' lists no devices"),
        (lambda d: d.update(status="broken"), r"status is 'broken'"),
        (lambda d: d.update(version="2.0"), r"version '2\.0' is not supported"),
        (lambda d: d.pop("server_list"), r"field 'server_list' is missing"),
    ],
)
def test_v10_errors_name_the_field(edit, message: str) -> None:
    with pytest.raises(RankTableError, match=message):
        parse_rank_table(table_with(V10, edit), "t.json")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["super_pod_list"][0]["server_list"].append({"server_id": "node_9"}), r"'node_9', which is not in"),
        (
            lambda d: d.update(
                super_pod_list=[
                    {"super_pod_id": "0", "server_list": [{"server_id": "node_0"}, {"server_id": "node_2"}]},
                    {"super_pod_id": "1", "server_list": [{"server_id": "node_1"}]},
                ]
            ),
            r"super pod '0': its servers must be contiguous.*server_list\[1\] \('node_1'\)",
        ),
        (lambda d: d["super_pod_list"][1]["server_list"].append({"server_id": "node_1"}), r"already in super pod '0'"),
        (lambda d: d["super_pod_list"][1].update(super_pod_id="0"), r"super pod '0' is listed twice"),
    ],
)
def test_v12_super_pod_errors(edit, message: str) -> None:
    with pytest.raises(RankTableError, match=message):
        parse_rank_table(table_with(V12, edit))


def test_generated_table_is_valid_and_distinct() -> None:
    data = generate_rank_table(3, 4)
    table = parse_rank_table(json.loads(json.dumps(data)))
    assert data["version"] == "1.0" and data["server_count"] == "3"
    assert len({s.server_id for s in table.servers}) == 3
    assert [d.device_id for d in table.servers[2].devices] == ["0", "1", "2", "3"]
    assert [d.rank_id for d in table.servers[2].devices] == [8, 9, 10, 11]
    assert simulated_server_id(255) == "127.0.1.0" and simulated_server_id(0) == "127.0.0.1"


def test_large_table_validates_quickly() -> None:
    data = generate_rank_table(1024, 16)
    t0 = time.perf_counter()
    table = parse_rank_table(data)
    assert table.rank_size == 16384
    assert time.perf_counter() - t0 < 2.0  # generous: the benchmark tracks the real figure


def test_a_table_past_65536_ranks_is_accepted_and_its_mistakes_still_named() -> None:
    """Issue 24: up to 1,048,576 ranks (65,536 nodes × 16); the bulk checks miss nothing the per-device one names."""
    data = generate_rank_table(4097, 16)  # 65,552 ranks: refused before
    assert parse_rank_table(data).rank_size == 65_552
    data["server_list"][4000]["device"][3]["rank_id"] = "17"  # rank 17 twice, rank 64,003 missing
    with pytest.raises(RankTableError, match=r"rank_id 17 is used twice \(server '127\.0\.0\.2' device 1 and"):
        parse_rank_table(data)
    data["server_list"][4000]["device"][3]["rank_id"] = " 64003 "  # spaces: the device-by-device path, same result
    data["server_list"][12]["device"][5]["device_ip"] = 7  # a number where text is expected is text
    table = parse_rank_table(data)
    assert table.servers[4000].devices[3].rank_id == 64_003 and table.servers[12].devices[5].device_ip == "7"


# -- loading and waiting ------------------------------------------------------------------


def test_waits_while_initializing(tmp_path: Path) -> None:
    path = tmp_path / "hccl.json"
    write_rank_table({"status": "initializing"}, path)
    messages: list[str] = []

    def finish() -> None:
        time.sleep(0.4)
        write_rank_table(V10, path)

    writer = threading.Thread(target=finish)
    writer.start()
    t0 = time.monotonic()
    table = load_rank_table(path, wait_timeout=10, poll=0.05, on_wait=messages.append)
    writer.join()
    assert table.rank_size == 4
    assert 0.3 < time.monotonic() - t0 < 5
    assert messages and "initializing" in messages[0]


def test_wait_has_a_deadline(tmp_path: Path) -> None:
    path = tmp_path / "hccl.json"
    write_rank_table({"status": "initializing", "server_list": []}, path)
    with pytest.raises(RankTableError, match=r"not ready after waiting 0\.3s .*status is still 'initializing'"):
        load_rank_table(path, wait_timeout=0.3, poll=0.05)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(RankTableError, match="does not exist"):
        load_rank_table(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RankTableError, match=r"is not valid JSON \(line 1"):
        load_rank_table(bad, wait_timeout=0.2, poll=0.05)


# -- this server --------------------------------------------------------------------------


def no_names() -> tuple[set[str], str]:
    return {"192.0.2.99"}, "laptop"


def test_single_server_is_this_one() -> None:
    one = table_with(V10, lambda d: (d.update(server_count="1"), d["server_list"].pop()))
    server, how = find_this_server(parse_rank_table(one), {}, names=no_names)
    assert server.server_id == "10.0.0.1" and "only server" in how


def test_ma_current_host_ip_picks_the_server() -> None:
    server, how = find_this_server(parse_rank_table(V10), {"MA_CURRENT_HOST_IP": "10.0.0.2"}, names=no_names)
    assert server.index == 1 and how == "MA_CURRENT_HOST_IP=10.0.0.2"


def test_host_ip_and_hostname_match_this_machine() -> None:
    table = parse_rank_table(V12)
    server, _ = find_this_server(table, {}, names=lambda: ({"172.16.0.112", "127.0.0.1"}, "x"))
    assert server.server_id == "node_2"
    server, _ = find_this_server(table, {}, names=lambda: ({"127.0.0.1"}, "node_1.cluster.local"))
    assert server.server_id == "node_1"


def test_not_found_lists_what_was_tried() -> None:
    with pytest.raises(PlatformError) as err:
        find_this_server(parse_rank_table(V10), {"MA_CURRENT_HOST_IP": "10.9.9.9"}, names=no_names)
    text = str(err.value)
    assert "MA_CURRENT_HOST_IP=10.9.9.9" in text and "192.0.2.99" in text and "'laptop'" in text
    assert "'10.0.0.1', '10.0.0.2'" in text
