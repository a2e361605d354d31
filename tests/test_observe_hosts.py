"""Straggler detection and the status view across real hosts (network namespaces), issue 16 items 2-3.

Two hosts × 2 ranks of a lock-step gloo job (``scripts/straggle.py``); each host runs its own
mlaunch the ModelArts way, with its **own** log directory (a copy of job.yaml per host), so
what host 1's ``mlaunch status`` shows of host 0's ranks can only have come through the
control plane. Rank 3 (on host 1) turns slow for a while: node 0's mlaunch, which judges
stragglers over every rank of the job, must name it and its host, then its recovery.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch
from netns import Host, hosts_fixture

from launchers.observe.events_log import read_events

pytestmark = [pytest.mark.netns, pytest.mark.slow]

hosts2 = pytest.fixture(hosts_fixture(2), name="hosts2")

STRAGGLE = ROOT / "tests" / "scripts" / "straggle.py"


def _start(hosts: list[Host], tmp: Path, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    started = []
    for host in hosts:
        home = tmp / f"host{host.index}"
        home.mkdir()
        job = home / "job.yaml"
        job.write_text(
            f"name: obs-hosts\nengine: pytorch\nentry: {STRAGGLE}\nnodes: 2\nprocs_per_node: 2\nlog_dir: logs\n"
            "monitor: {straggler_factor: 1.5, straggler_steps: 5, node_timeout: 10s}\n"
        )
        host_env = clean_env(MA_NUM_GPUS="2", GLOO_SOCKET_IFNAME="eth0", **env)
        argv = [*mlaunch_cmd(), "--engine", "pytorch", str(job), "--init_method", f"tcp://{hosts[0].name}:6666"]
        argv += ["--rank", str(host.index), "--world_size", "2"]
        started.append(host.popen(argv, env=host_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return started


def _status(host: Host, tmp: Path) -> dict[str, Any] | None:
    shown = host.run(
        [*mlaunch_cmd(), "status", "--json", str(tmp / f"host{host.index}" / "job.yaml")], env=clean_env(), cwd=ROOT
    )
    return json.loads(shown.stdout) if shown.returncode == 0 else None


@needs_torch
def test_a_straggler_on_host_2_is_named_by_node_0_and_host_2_status_shows_every_rank(
    tmp_path: Path, hosts2: list[Host]
) -> None:
    env = {"STRAGGLE_RANK": "3", "STRAGGLE_FROM": "60", "STRAGGLE_TO": "85", "STRAGGLE_STEPS": "250"}
    procs = _start(hosts2, tmp_path, env)
    seen: dict[int, list[int]] = {}
    try:
        deadline = time.monotonic() + 120  # until every rank of both hosts was seen moving (relays come ~1 s apart)
        while time.monotonic() < deadline and not (len(seen) == 4 and all(v[-1] > v[0] for v in seen.values())):
            if any(p.poll() is not None for p in procs):
                break  # the job ended: what was seen is judged below
            data = _status(hosts2[1], tmp_path)
            for node in (data or {}).get("nodes", []):
                for r in node["ranks"]:
                    if r["step"] is not None:
                        seen.setdefault(r["rank"], []).append(r["step"])
            time.sleep(0.5)
    finally:
        results = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    text = "\n".join(f"--- host {i} exit {rc}\n{out}\n{err}" for i, (rc, out, err) in enumerate(results))
    assert [rc for rc, _, _ in results] == [0, 0], text
    assert sorted(seen) == [0, 1, 2, 3], (seen, text)  # host 1 saw host 0's ranks too: through the control plane
    assert all(v[-1] > v[0] for v in seen.values()), seen
    node0_err = results[0][2]
    assert re.search(rf"straggler: rank 3 \(node 1, host {re.escape(hosts2[1].hostname)}\) at step \d+", node0_err), (
        text
    )
    assert "straggler recovered: rank 3" in node0_err, text
    events = read_events(tmp_path / "host0" / "logs" / "events.jsonl")
    changes = [(e["event"], e["rank"]) for e in events if e["event"].startswith("straggler")]
    assert changes == [("straggler", 3), ("straggler_recovered", 3)], events
    final = _status(hosts2[1], tmp_path)
    assert final is not None and final["stragglers"] == [], final
