"""The node health check across real hosts (network namespaces), issue 16 item 1.

Each host runs its own mlaunch the ModelArts way; node 0 hosts the control plane (port 7666)
and the link test's TCPStore (7667). Faults are real (``health_faults``): a token-bucket
rate limit on a host's eth0, and a cgroup giving a host's processes 15 % of a CPU.

- 4 hosts, host 1 rate-limited and host 2 starved: the check names exactly those two, and
  with ``on_failure: fail`` every mlaunch exits 75 and no rank trains;
- 3 hosts, host 1 rate-limited: ``mlaunch health`` names it (DLRover needs 4 nodes for that);
- 3 hosts, host 2's link down: node 0 names it faulty (no result) at the deadline.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import needs_torch
from health_faults import finish, slow_link, start, starved_cgroup, write_job
from netns import IP, Host, hosts_fixture

from launchers.health.check import HEALTH_EXIT_CODE
from launchers.observe.events_log import read_events

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_torch]

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3")
hosts4 = pytest.fixture(hosts_fixture(4), name="hosts4")


def dump(results: list[tuple[int, str, str]]) -> str:
    return "\n".join(f"--- host {i} exit {rc}\n{out}\n{err}" for i, (rc, out, err) in enumerate(results))


def bad_hosts(tmp_path: Path) -> dict[str, str]:
    doc = json.loads((tmp_path / "logs" / "health.json").read_text())
    return {n["host"]: n["verdict"] for n in doc["nodes"] if n["verdict"] != "ok"}


def test_slow_link_and_starved_cpu_among_four_are_named_and_nothing_trains(tmp_path: Path, hosts4: list[Host]) -> None:
    slow_link(hosts4[1])
    job = write_job(tmp_path, 4, "{before_start: true, on_failure: fail, timeout: 90s}")
    with starved_cgroup(15) as procs_file:
        results = finish(start(hosts4, job, ["run"], starved={2: procs_file}))
    print(results[0][2])  # node 0's table (shown with pytest -s)
    assert [rc for rc, _, _ in results] == [HEALTH_EXIT_CODE] * 4, dump(results)
    assert set(bad_hosts(tmp_path)) == {hosts4[1].hostname, hosts4[2].hostname}, dump(results)
    assert "every link slow" in results[0][2] and "compute" in results[0][2], dump(results)
    assert not list(tmp_path.glob("trained-*")), "a rank trained although the health check failed"
    for _, _, err in results:  # every node names the bad hosts
        assert hosts4[1].hostname in err and hosts4[2].hostname in err and "no training starts" in err
    health = [e for e in read_events(tmp_path / "logs" / "events.jsonl") if e["event"] == "health"]
    assert health and all(set(e["bad"]) == {hosts4[1].hostname, hosts4[2].hostname} for e in health), health


def test_three_hosts_one_rate_limited_is_named(tmp_path: Path, hosts3: list[Host]) -> None:
    slow_link(hosts3[1])
    job = write_job(tmp_path, 3, "{on_failure: fail, timeout: 60s}")
    began = time.monotonic()
    results = finish(start(hosts3, job, ["health"]))
    took = time.monotonic() - began
    assert [rc for rc, _, _ in results] == [HEALTH_EXIT_CODE] * 3, dump(results)
    assert bad_hosts(tmp_path) == {hosts3[1].hostname: "straggler"}, dump(results)
    assert took < 60, f"the whole check took {took:.1f}s"


def test_a_host_whose_link_is_down_is_named_faulty_by_node_0(tmp_path: Path, hosts3: list[Host]) -> None:
    """Host 2 cannot reach anyone: node 0 judges what arrived by the deadline, every mlaunch exits 75."""
    subprocess.run([IP, "-n", hosts3[2].ns, "link", "set", "eth0", "down"], check=True, timeout=10)
    job = write_job(tmp_path, 3, "{on_failure: fail, timeout: 15s}")
    results = finish(start(hosts3, job, ["health"]))
    assert [rc for rc, _, _ in results] == [HEALTH_EXIT_CODE] * 3, dump(results)
    assert bad_hosts(tmp_path) == {hosts3[2].name: "faulty"}, dump(results)  # it never said its hostname
    doc = json.loads((tmp_path / "logs" / "health.json").read_text())
    assert "no health result" in doc["nodes"][2]["reason"]
