"""Node 0's loss is a shrink like any other (issue 45): 3 network-namespace hosts, ``pytorch.nnodes: "2:3"``.

One mlaunch per host the ModelArts way (``--init_method tcp://HOST0:6666 --rank I``, the host list in
``VC_WORKER_HOSTS``), real gloo DDP training across the hosts' ``eth0`` (the chaos wrapper of the
DDP example, a save every 5 steps, ``checkpoint.replicate: off``: the shrink resumes from the newest
*committed* step):

- node 0's mlaunch SIGKILLed: hosts 2-3 move the hub to node 1 (the lowest survivor), node 1 hosts
  the ranks' rendezvous master, and they go on as a 2-node job from the newest committed step with
  the model it saved; both end 0 with one final checksum;
- node 0's link cut (nothing closes): the same after ``node_timeout``; node 0, cut off with 1 of 3
  nodes, holds no majority: its mlaunch ends non-zero and its ranks are gone;
- node 0 comes back (2 ranks a host, ``elastic.grow: at_checkpoint``): its mlaunch killed, the job goes
  on with 2 nodes at node 1's hub, node 0's mlaunch started again with its same environment (rank 0,
  master address = itself) finds that hub through the host list, waits as a candidate, and is
  admitted at the next committed checkpoint; the job ends 0 on every node with one final checksum,
  no process left in any host and no file in the run's shared memory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, needs_torch
from netns import Host, hosts_fixture
from test_membership_hosts import NODE_TIMEOUT, RESUMED, SAVED, Launches, start_ddp, write_job

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import CHAOS, final_checksum  # noqa: E402

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_torch]

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3")
LEFT_0 = r"membership \(generation 1\): 3 → 2 nodes \(3 → 2 ranks\); nodes in the job: 1, 2; left: 0 \(\S+\): "


def moved(run: Launches, since: float) -> float:
    """The 2-node job re-formed and resumed on hosts 2-3 (node 1 is its node rank 0): seconds to the re-form.

    The re-form is the control plane's part (the hub moved, the members met, the plan made); the
    ranks' start that follows is any restart's (cold on this busy machine when the standbys are not warm).
    """
    run.wait_for(LEFT_0, host=1, timeout=60)
    took = time.monotonic() - since
    resumed = run.wait_for(RESUMED.pattern, host=1, timeout=120)
    text = run.text()
    checksums = {int(step): checksum for step, checksum in SAVED.findall(run.text(0))}
    assert "hosts the hub now" in run.text(1), text
    assert int(resumed[1]) == max(checksums), text  # the newest committed step, none lost
    assert (resumed[2], resumed[3]) == ("3", "2") and resumed[4] == checksums[int(resumed[1])], text
    return took


def test_node_0_s_mlaunch_killed_the_others_move_the_hub_and_go_on(tmp_path: Path, hosts3: list[Host]) -> None:
    run = start_ddp(tmp_path, hosts3, 40, CHAOS_SHOW_ENV="RANK,WORLD_SIZE,MASTER_ADDR,VC_WORKER_HOSTS")
    try:
        run.wait_for(r"saved step (9|1\d): model-checksum", host=0)
        run.procs[0].kill()
        took = moved(run, time.monotonic())
        shown = run.last(r"chaos env 0 (.*)", host=1, since="hosts the hub now")
        assert shown, run.text()
        names = ",".join(h.name for h in hosts3[1:])
        assert shown[1] == f"RANK=0 WORLD_SIZE=2 MASTER_ADDR={hosts3[1].name} VC_WORKER_HOSTS={names}", run.text()
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    print(f"node 0's mlaunch killed → the 2-node job re-formed in {took:.2f}s")
    assert took < NODE_TIMEOUT + 10, text  # its connection closed: a few heartbeats (1.9 s idle), as any member's
    assert codes[1] == 0 and codes[2] == 0, (codes, text)
    assert final_checksum(run.text(1)), text  # the 2-node job's rank 0 (node 1) finished the training
    # the job's whole view moved with the hub: `mlaunch status` (the shared log directory's status.json) is the
    # job as node 1's hub saw it, both nodes of the job and not node 0's last view of three
    status = json.loads((tmp_path / "logs" / "status.json").read_text())
    assert status["scope"] == "job" and sorted(n["index"] for n in status["nodes"]) == [1, 2], status


def test_node_0_s_mlaunch_stopped_by_sigterm_hands_the_hub_over_and_the_others_go_on(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    """A preemption of node 0 (SIGTERM to its mlaunch): it says it is leaving, the others move the hub at once (no
    silence to wait out), stop gracefully and resume at 2 nodes from the newest committed step; node 0 ends 143."""
    import signal

    run = start_ddp(tmp_path, hosts3, 40)
    try:
        run.wait_for(r"saved step (9|1\d): model-checksum", host=0)
        run.procs[0].send_signal(signal.SIGTERM)
        took = moved(run, time.monotonic())
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    print(f"node 0's mlaunch stopped by SIGTERM → the 2-node job re-formed in {took:.2f}s")
    assert codes == {0: 143, 1: 0, 2: 0}, (codes, text)
    assert "its mlaunch was stopped by SIGTERM (a preemption)" in run.text(1), text  # said, not judged silent
    assert final_checksum(run.text(1)), text


def test_node_0_s_link_cut_the_others_go_on_and_node_0_ends_alone(tmp_path: Path, hosts3: list[Host]) -> None:
    from netns import IP

    run = start_ddp(tmp_path, hosts3, 40)
    try:
        run.wait_for(r"saved step (9|1\d): model-checksum", host=0)
        cut = time.monotonic()
        subprocess.run([IP, "-n", hosts3[0].ns, "link", "set", "eth0", "down"], check=True, timeout=10)
        took = moved(run, cut)
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    print(f"node 0's link cut → the 2-node job re-formed in {took:.2f}s (node_timeout {NODE_TIMEOUT:g}s)")
    assert took < NODE_TIMEOUT + 10, text  # nothing closed: node_timeout of silence since it was last heard
    assert codes[1] == 0 and codes[2] == 0 and codes[0] != 0, (codes, text)
    assert re.search(r"node [12] \(\S+\) is lost: .*below the elastic minimum 2", run.text(0)), text  # it knows why
    assert final_checksum(run.text(1)), text
    assert final_checksum(run.text(0)) is None, text  # node 0 never trained on alone


def test_node_0_restarted_with_its_same_environment_finds_the_moved_hub_and_is_admitted(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    from netns import IP

    args = "'--steps', '60', '--save-every', '5', '--workers', '0'"
    job = write_job(tmp_path, CHAOS, args, extra="elastic: {grow: at_checkpoint}\n")
    (tmp_path / "chaos").mkdir()
    shm = tmp_path / "shm"
    shm.mkdir()
    run = Launches(hosts3, job, CHAOS_STATE=str(tmp_path / "chaos"), CHAOS_STEP_SLEEP="0.1", MA_NUM_GPUS="2",
                   MLAUNCH_SHM_DIR=str(shm))  # fmt: skip
    try:
        for index in range(3):
            run.start(index)
        run.wait_for(r"saved step (9|1\d): model-checksum", host=0)
        run.procs[0].kill()
        run.wait_for(r"membership \(generation 1\): 3 → 2 nodes \(6 → 4 ranks\); nodes in the job: 1, 2; left: 0 ")
        run.wait_for(RESUMED.pattern, host=1)  # the 2-node job trains
        began = time.monotonic()
        run.start(0)  # the platform restarted node 0's pod: rank 0, the master address its own host
        run.wait_for(r"node 0: the job's hub runs on node 1 \(it moved there\); joining it", host=0)
        run.wait_for(r"node 0: the job is already running; this node starts no ranks and waits", host=0)
        waits = time.monotonic() - began
        regroup = run.wait_for(r"wait to join and step (\d+) is committed", host=1)  # the hub's node grows it
        run.wait_for(r"node 0: admitted to the job at generation \d+", host=0)
        admitted = time.monotonic() - began
        grown = run.wait_for(RESUMED.pattern, host=0)  # node 0 is node rank 0 again: its rank 0 says it
        assert int(grown[1]) >= int(regroup[1]) and (grown[2], grown[3]) == ("4", "6"), run.text()
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    print(f"node 0's mlaunch started again → a candidate at node 1's hub {waits:.2f}s later, admitted {admitted:.2f}s")
    assert codes == {0: 0, 1: 0, 2: 0}, (codes, text)
    assert "(hosting it)" not in run.text(0).split("joining it")[-1], text  # it never hosted a second hub
    assert len(set(re.findall(r"final-checksum ([0-9a-f]+)", text))) == 1 and final_checksum(run.text(0)), text
    assert re.search(r"membership \(generation \d+\): 2 → 3 nodes \(4 → 6 ranks\); nodes in the job: 0, 1, 2", text)
    for host in hosts3:  # nothing left: no process in any host, nothing of the run in shared memory
        assert not subprocess.run([IP, "netns", "pids", host.ns], capture_output=True, text=True).stdout.split()
    assert not [p.name for p in shm.iterdir() if p.name.lstrip(".").startswith("mlaunch.")], list(shm.iterdir())


def test_node_0_restarted_at_once_leaves_its_fresh_hub_for_the_moved_one_and_is_admitted(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    """Node 0's mlaunch killed and started again at once (a platform restarting a crashed container within a
    second): nobody answers its probe yet, so it hosts a fresh hub, which the others never join (they move the
    hub to node 1 after their fuse). Its fresh hub waiting for the first meeting probes the other hosts again,
    finds node 1's hub and joins it as a returning node: admitted, one final checksum, every node ends 0.
    Before, it waited at its own hub until the job ended without it (then failed, or hung for minutes)."""
    args = "'--steps', '50', '--save-every', '5', '--workers', '0'"
    job = write_job(tmp_path, CHAOS, args, extra="elastic: {grow: at_checkpoint}\n")
    (tmp_path / "chaos").mkdir()
    run = Launches(hosts3, job, CHAOS_STATE=str(tmp_path / "chaos"), CHAOS_STEP_SLEEP="0.1", MA_NUM_GPUS="2")
    try:
        run.start_all()
        run.wait_for(r"saved step (9|1\d): model-checksum", host=0)
        run.procs[0].kill()
        run.procs[0].wait()
        run.start(0)  # at once: before the others judged node 0 lost and moved the hub
        run.wait_for(r"node 0: the job's hub runs on node 1 \(it moved there\); joining it", host=0)
        run.wait_for(r"node 0: admitted to the job at generation \d+", host=0)
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    assert codes == {0: 0, 1: 0, 2: 0}, (codes, text)
    assert "(hosting it)" in run.text(0).split("joining it")[0], text  # it did host a fresh hub first
    assert len(set(re.findall(r"final-checksum ([0-9a-f]+)", text))) == 1 and final_checksum(run.text(0)), text
