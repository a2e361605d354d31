"""A lost machine costs one step, not a checkpoint interval (``checkpoint.replicate``), on 3 netns hosts.

One mlaunch per host (ModelArts-style arguments), one rank per host, real gloo across the hosts'
``eth0``, ``pytorch.nnodes`` elastic. The job (``tests/scripts/replica_train.py``) stages every
step and prints an exact, world-size-independent digest of the state it staged; nothing is
ever saved by the ranks, so without replication a lost host means a fresh start. What a user
relies on is checked by those digests: the state the smaller job loaded is the state the old
job had at the step it resumed from, and that step is the newest staged one or the one before
(the step in flight when the link went).

- DDP (replicated: no copy streamed), host 3's link cut: the survivors commit their own step;
- FSDP2 (sharded: each host streams its slots to the next), host 3's link cut, then host 2's
  mlaunch killed after the ring re-formed with 2 hosts (host 3 — host 2's buddy — was lost
  first): each time the lost host's shards come from its buddy;
- FSDP2, hosts 2 and 3 lost at once (host 2's buddy is host 3): nothing newer than the last
  commit is whole; the survivors fall back to it and say so.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, needs_torch, run_mlaunch
from netns import IP, Host, hosts_fixture

sys.path.insert(0, str(ROOT / "tests"))
from test_membership_hosts import Launches  # noqa: E402

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_torch]

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3")

SCRIPT = ROOT / "tests" / "scripts" / "replica_train.py"
STAGED = re.compile(r"staged step (\d+): state-digest (\d+)")
RESUMED = r"resumed from step (\d+) \(saved by (\d+) ranks, now (\d+)\): state-digest (\d+)"


def write_job(tmp: Path, mode: str, nnodes: str, extra: str = "", save_every: int = 0) -> Path:
    job = tmp / "job.yaml"
    args = f"'--mode', '{mode}', '--steps', '400', '--step-sleep', '0.1', '--save-every', '{save_every}'"
    job.write_text(
        f"name: replicas\nengine: pytorch\nentry: {SCRIPT}\nargs: [{args}]\nnodes: 3\nprocs_per_node: 1\n"
        f"log_dir: {tmp / 'logs'}\ncheckpoint: {{dir: {tmp / 'ckpt'}, grace_period: 20s, keep: 50{extra}}}\n"
        "restart: {max_restarts: 0, backoff: 0s}\nmonitor: {node_timeout: 3s}\n"
        f"pytorch: {{nnodes: '{nnodes}'}}\nenv: {{OMP_NUM_THREADS: '1'}}\n"
    )
    return job


def start(tmp: Path, hosts: list[Host], job: Path) -> Launches:
    return Launches(hosts, job).start_all()


def staged(run: Launches) -> dict[int, str]:
    """Every step rank 0 staged so far, with the digest of the state it staged."""
    run.last("$^", 0, "")  # drain what arrived
    return {int(s): d for s, d in STAGED.findall(run.text(0))}


def resumed_after_loss(run: Launches, world: int) -> tuple[int, str, dict[int, str]]:
    """The next resume: its step and digest, and every step staged before it (with their digests)."""
    found = run.wait_for(RESUMED, host=0, timeout=90)
    before = staged(run)
    assert int(found[3]) == world, run.text()
    return int(found[1]), found[4], before


def cut_link(host: Host) -> None:
    subprocess.run([IP, "-n", host.ns, "link", "set", "eth0", "down"], check=True, timeout=10)


def streamed_steps(log_dir: Path, nodes: int) -> list[object]:
    """Each node's newest step its buddy holds, from node 0's status.json, once every node reported one."""
    deadline = time.monotonic() + 20
    steps: list[object] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            view = json.loads((log_dir / "status.json").read_text())
            steps = [n.get("replicated_step") for n in view.get("nodes", [])]
            if len(steps) == nodes and all(isinstance(s, int) for s in steps):
                return steps
        time.sleep(0.2)
    return steps


def node_loss_events(log_dir: Path) -> list[dict[str, object]]:
    lines = (log_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "node_loss" and e.get("node") == 0]


def test_ddp_link_cut_costs_at_most_the_step_in_flight(tmp_path: Path, hosts3: list[Host]) -> None:
    run = start(tmp_path, hosts3, write_job(tmp_path, "ddp", "2:3"))
    try:
        run.wait_for(r"staged step 8:", host=0)
        cut_link(hosts3[2])
        step, shown, before = resumed_after_loss(run, 2)
        run.wait_for(r"staged step \d+:", host=0)  # the 2-host job trains on
    finally:
        run.kill()
    text = run.text()
    assert max(before) - step <= 1 and shown == before[step], text  # at most the step in flight; the same state
    assert re.search(
        rf"node loss \(rank\(s\) 2\): committed step {step} from the survivors' own ranks: replicated state",
        run.text(0),
    ), text
    assert "saved by 2 ranks, now 2" in text, text  # the survivors' own shards, numbered as the 2-host job
    assert "replication: " not in text, text  # nothing streamed: the state is replicated
    events = node_loss_events(tmp_path / "logs")
    assert events and events[0]["how"] == "replicated" and events[0]["step"] == step, events


def test_fsdp2_lost_hosts_shards_come_from_the_buddy_even_after_the_buddy_went_first(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    job = write_job(tmp_path, "fsdp2", "1:3")
    run = start(tmp_path, hosts3, job)
    try:
        run.wait_for(r"staged step 8:", host=0)
        replicated = streamed_steps(tmp_path / "logs", 3)  # mlaunch status: every node's newest copy at its buddy
        status = run_mlaunch(["status", str(job)], env=clean_env(COLUMNS="400")).stdout
        cut_link(hosts3[2])  # host 3: host 2's buddy (the ring 1 → 2 → 3 → 1)
        step, shown, before = resumed_after_loss(run, 2)
        assert max(before) - step <= 1 and shown == before[step], run.text()
        assert re.search(rf"node loss \(rank\(s\) 2\): committed step {step} from buddy copies", run.text(0)), (
            run.text()
        )
        run.wait_for(rf"staged step {step + 5}:", host=0)  # the ring re-formed: 1 → 2 → 1
        run.procs[1].send_signal(signal.SIGKILL)  # host 2's mlaunch: now its buddy is host 1
        step2, shown2, before2 = resumed_after_loss(run, 1)
        assert max(before2) - step2 <= 1 and shown2 == before2[step2], run.text()
        assert step2 > step, run.text()
    finally:
        run.kill()
    text = run.text()
    assert all(isinstance(step, int) and step >= 0 for step in replicated), replicated
    assert re.search(
        r"machine-loss replication, newest step a buddy holds: node 0: step \d+, node 1: step \d+", status
    ), status
    assert text.count("saved by 3 ranks, now 2") == 1 and "saved by 2 ranks, now 1" in text, text
    assert [e["how"] for e in node_loss_events(tmp_path / "logs")] == ["buddy", "buddy"], text


def test_fsdp2_owner_and_buddy_lost_together_fall_back_to_the_last_commit(tmp_path: Path, hosts3: list[Host]) -> None:
    run = start(tmp_path, hosts3, write_job(tmp_path, "fsdp2", "1:3", save_every=5))
    try:
        run.wait_for(r"saved step 9\b", host=0)
        run.procs[1].send_signal(signal.SIGKILL)  # host 2 and its buddy, host 3, at once
        run.procs[2].send_signal(signal.SIGKILL)
        step, shown, before = resumed_after_loss(run, 1)
    finally:
        run.kill()
    text = run.text()
    saves = [int(s) for s in re.findall(r"saved step (\d+)", run.text(0))]
    assert step == max(saves) and shown == before[step], text
    assert re.search(
        rf"node loss \(rank\(s\) 1, 2\): resuming from the last commit, step {step}: "
        r"rank\(s\) 1: their node and its buddy",
        text,
    ), text
    events = node_loss_events(tmp_path / "logs")
    assert events and events[0]["how"] == "fallback" and events[0].get("fallback_step") == step, events


def test_fsdp2_ring_re_forms_when_the_lost_host_comes_back(tmp_path: Path, hosts3: list[Host]) -> None:
    """Shrink (host 3's link cut), grow (host 3 back, admitted after the next commit), then host 2 lost: its
    shards come from host 3 — its buddy again only because the ring re-formed with 3 hosts."""
    job = write_job(tmp_path, "fsdp2", "2:3", save_every=10)
    job.write_text(job.read_text() + "elastic: {grow: at_checkpoint}\n")
    run = start(tmp_path, hosts3, job)
    try:
        run.wait_for(r"staged step 8:", host=0)
        cut_link(hosts3[2])
        step, shown, before = resumed_after_loss(run, 2)
        assert max(before) - step <= 1 and shown == before[step], run.text()
        run.procs[2].wait(timeout=30)  # host 3's mlaunch, cut off, gave up on node 0
        subprocess.run([IP, "-n", hosts3[2].ns, "link", "set", "eth0", "up"], check=True, timeout=10)
        run.start(2)  # the platform restarted host 3's pod
        run.wait_for(RESUMED, host=0, timeout=90)  # the 3-host job, from the graceful stop's save
        grown = run.wait_for(r"staged step (\d+):", host=0)
        kill_at = int(grown[1]) + 4
        while kill_at % 10 in (9, 0):  # not beside the script's own save (every 10): that commit is the newest then
            kill_at += 1
        run.wait_for(rf"staged step {kill_at}:", host=0)
        run.procs[1].send_signal(signal.SIGKILL)  # host 2: its buddy is host 3 again
        step2, shown2, before2 = resumed_after_loss(run, 2)
    finally:
        run.kill()
    text = run.text()
    assert max(before2) - step2 <= 1 and shown2 == before2[step2], text
    assert re.search(rf"node loss \(rank\(s\) 1\): committed step {step2} from buddy copies", run.text(0)), text
    assert [e["how"] for e in node_loss_events(tmp_path / "logs")] == ["buddy", "buddy"], text
