"""Node 0's loss is a shrink like any other (issue 45): 3 network-namespace hosts, ``pytorch.nnodes: "2:3"``.

One mlaunch per host the ModelArts way (``--init_method tcp://HOST0:6666 --rank I``, the host list in
``VC_WORKER_HOSTS``), real gloo DDP training across the hosts' ``eth0`` (the chaos wrapper of the
DDP example, a save every 5 steps, ``checkpoint.replicate: off``: the shrink resumes from the newest
*committed* step):

- node 0's mlaunch SIGKILLed: hosts 2-3 move the hub to node 1 (the lowest survivor), node 1 hosts
  the ranks' rendezvous master, and they go on as a 2-node job from the newest committed step with
  the model it saved; both end 0 with one final checksum;
- node 0's link cut (nothing closes): the same after ``node_timeout``; node 0, cut off with 1 of 3
  nodes, holds no majority: its mlaunch ends non-zero and its ranks are gone.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, needs_torch
from netns import Host, hosts_fixture
from test_membership_hosts import NODE_TIMEOUT, RESUMED, SAVED, Launches, start_ddp

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import final_checksum  # noqa: E402

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
