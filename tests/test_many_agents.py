"""128 real mlaunch agents on this machine (issue 24 item 5): the control plane with every node's mlaunch.

One mlaunch per node, ModelArts-style arguments on 127.0.0.1, one light rank each (no torch;
``tests/many_agents.py``). Heavy on two cores (128 interpreters and their ranks), so slow;
``benchmarks/real_agents.py`` prints the times this only bounds. Node 0, the hub's, runs at a higher CPU
weight (``many_agents.HUB_NICE``), as a real node 0 has a machine of its own.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from many_agents import HUB_NICE, NODE_TIMEOUT, job_port, leftovers, start

pytestmark = [pytest.mark.slow, pytest.mark.machine_alone]  # 128 mlaunch fill both cores

COUNT = 128
STARTUP = 600.0  # seconds for 128 mlaunch to start their ranks on two cores


def test_a_rank_killed_on_node_64_restarts_every_node_together_and_all_exit_0(tmp_path: Path) -> None:
    agents = start(tmp_path, COUNT, job_port(), HUB_NICE, KILL_RANK="64", RUN="600", RUN_AGAIN="2")
    try:
        assert len(agents.wait_started(0, STARTUP)) == COUNT, agents.why_not_started(0)
        (agents.marks / "go").write_text("go\n")
        restarted = agents.wait_started(1, 120)
        codes = agents.wait_exits(120)
    finally:
        agents.kill_all()
    assert sorted(restarted) == list(range(COUNT)), "every node's rank started again (attempt 1)"
    assert codes == dict.fromkeys(range(COUNT), 0), {n: agents.stderr(n)[-600:] for n, c in codes.items() if c}
    assert "first failure in the job (generation 0): node 64" in agents.stderr(3)
    assert leftovers(tmp_path) == []


def test_node_64s_mlaunch_killed_ends_every_other_node_naming_it(tmp_path: Path) -> None:
    agents = start(tmp_path, COUNT, job_port(), HUB_NICE, RUN="600")
    try:
        assert len(agents.wait_started(0, STARTUP)) == COUNT, agents.why_not_started(0)
        killed = time.time()
        os.kill(agents.procs[64].pid, signal.SIGKILL)
        codes = agents.wait_exits(NODE_TIMEOUT + 120)
    finally:
        agents.kill_all()
    others = [n for n in range(COUNT) if n != 64]
    assert all(codes.get(n, 0) != 0 for n in others), codes
    unnamed = [n for n in others if "node 64" not in agents.stderr(n)]
    assert not unnamed, agents.stderr(unnamed[0])[-1500:]
    assert all(agents.exited[n] - killed > NODE_TIMEOUT - 1 for n in others)  # by the timeout, not by a guess
    assert leftovers(tmp_path) == []
