"""``benchmarks/control_scale.py``'s hub-loss phase at 16 nodes (issue 45 item 5), as the benchmark runs it at 4,096.

The real plane: node 0's ``NetworkEvents`` (the hub) in a process and network namespace of its
own, node 1's mlaunch agent in another process, 14 agents on one driver; node 0's process is
SIGKILLed and every survivor must be welcomed by node 1's successor hub and finish the meeting
after it. Figures are the benchmark's to print; this checks that the phase measures what it says.
"""

from __future__ import annotations

import math
import sys

import pytest
from conftest import ROOT
from netns import netns_unavailable_reason

from launchers.control.transport import has_curve

sys.path.insert(0, str(ROOT))
from benchmarks import control_scale  # noqa: E402

NODES = 16


def test_after_node_0_is_killed_every_agent_meets_at_node_1_s_hub() -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    r = control_scale.run(NODES, 2.0)
    assert r["join"] == r["join"], "the agents never joined node 0's hub"  # NaN: not every agent was welcomed
    assert r["loss_met"] == r["loss_survivors"] == NODES - 1, r
    assert 0 < r["detect_first"] <= r["detect_max"] <= r["welcome_max"] <= r["met_max"], r
    assert r["met_max"] < control_scale.NODE_TIMEOUT  # the closed connection found it, not node_timeout
    assert math.isfinite(r["move_met_s"]) and r["own_max"] <= r["move_s"], r
    if has_curve():  # each survivor's CURVE handshake at the new hub, once: no old socket came back to it
        assert r["loss_handshakes"] == NODES - 1, r
