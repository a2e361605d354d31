"""A slow stream among three nodes: losing its node costs steps, never the work since the last commit.

Three nodes' parts of mlaunch in one process, each one real and on loopback: a control-plane
agent (node 0 hosting the hub), a ``ReplicaStore``, and a ``PeerCopy`` streaming its rank's
staged slots to the next node, its rounds agreed through the agents (``replication.rounds``,
the same function mlaunch uses). One writer process stages the three ranks' shards (one rank per
node) in lockstep every ~30 ms, as ranks that all-reduce every step do. Node 2's stream crosses
a ~2 MB/s link (a forwarding proxy), so each of its copies takes ~0.5 s, ~16 steps.

Node 2 is then lost mid-run: the survivors' holdings (shared memory, the copies they kept, the
slots their store holds) go to the decision the survivors' commit takes (``replica_plan.decide``).
What a user relies on: it commits a step from node 2's buddy copy, and the copy is byte for byte
what rank 2 staged at that step. Before the rounds each stream chose its own steps; node 2's buddy
then held steps no survivor had kept, and the loss fell back to the last commit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from test_peer_copy import slow_link

from launchers.elastic.ipc import staging
from launchers.persist.peer_copy import PeerCopy
from launchers.persist.replica_plan import Holding, decide, ring
from launchers.persist.replica_store import ReplicaStore
from launchers.persist.replication import rounds
from launchers.persist.slot_copy import LiveSegment, open_ranks
from launchers.platform.cluster import free_port

zmq = pytest.importorskip("zmq")
SECRET = b"k" * 32
RUN = "rounds"
WRITER = """
import sys, time, numpy as np
from launchers.elastic.format import shardfile
from launchers.elastic.ipc import staging
segs = [staging.Segment(staging.segment_path(sys.argv[1], r), r, 3, 0) for r in range(3)]
for seg in segs:
    seg.set_target(sys.argv[2], 3)
for step in range(int(sys.argv[3])):
    for rank, seg in enumerate(segs):
        seg.stage(step, shardfile.encode({"x": np.full(1 << 18, step + 1000 * rank, dtype=np.float32)}, {"step": step}))
    time.sleep(0.03)
print("done", flush=True)
"""


def staged_image(rank: int, step: int) -> bytes:
    import numpy as np

    from launchers.elastic.format import shardfile

    enc = shardfile.encode({"x": np.full(1 << 18, step + 1000 * rank, dtype=np.float32)}, {"step": step})
    buf = bytearray(enc.size)
    shardfile.write_into(memoryview(buf), enc)
    return bytes(buf)


def agents() -> list[Any]:
    from launchers.control.agent import NetworkEvents

    port = free_port()
    events = [
        NetworkEvents(node=n, nnodes=3, master_addr="127.0.0.1", port=port, secret=SECRET, node_timeout=30.0)
        for n in range(3)
    ]
    deadline = time.monotonic() + 30
    assert all(e.joined(deadline) for e in events), "an agent never joined the hub"
    return events


def in_shared_memory(rank: int) -> list[int]:
    segments: dict[int, LiveSegment] = {}
    open_ranks(RUN, {rank}, segments)
    head = segments[rank].header()
    assert head is not None
    steps = sorted(head.complete(0))
    segments[rank].close()
    return steps


def test_losing_the_node_of_a_slow_stream_commits_its_buddy_copy_not_the_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    events = agents()
    stores = [ReplicaStore(SECRET, bind="127.0.0.1") for _ in range(3)]
    buddy = ring([0, 1, 2])  # 0 → 1 → 2 → 0: node 2's copies go to node 0, over the slow link
    ports = {0: stores[1].port, 1: stores[2].port, 2: slow_link(stores[0].port, 2e6)}
    senders = [
        PeerCopy(RUN, 0, n, {n}, ("127.0.0.1", ports[n]), SECRET, "peer", rounds(events[n].reduce, 0)).start()
        for n in range(3)
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLAUNCH_SHM_DIR": str(tmp_path)}
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, RUN, str(tmp_path / "ckpt"), "400"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while senders[2].stats.sent_steps < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # a few of node 2's slow copies went through; the ranks are far ahead of them
        assert senders[2].stats.sent_steps >= 3, senders[2].stats
        time.sleep(0.2)  # node 2 dies mid-copy, while the ranks train on
        for sender in senders:
            sender.stop(wait=0.5)
        newest = max(in_shared_memory(0))
        holdings = {
            n: Holding(
                n,
                own={n: sorted(set(in_shared_memory(n)) | set(senders[n].retained_steps().get(n, [])))},
                held={2: stores[n].holding(0).get(2, [])} if buddy[2] == n else {},
                sharded=True,
                world=3,
                newest=newest,
            )
            for n in (0, 1)
        }
        verdict = decide(holdings)
        assert verdict.how == "buddy" and verdict.step is not None, (verdict, holdings)
        image = stores[0].image(0, 2, verdict.step)
        assert image is not None and bytes(image) == staged_image(2, verdict.step), verdict.step
        behind = newest - verdict.step
        assert behind > 2, "the slow stream was not behind: nothing was tested"
        rounds_done = [s.stats.rounds for s in senders]
        assert max(rounds_done) - min(rounds_done) <= 1, rounds_done  # every node at the slow stream's pace
    finally:
        writer.kill()
        writer.wait()
        for sender in senders:
            sender.stop(wait=0.1)
        for store in stores:
            store.close()
        for e in reversed(events):
            e.close(0)
        staging.unlink_run(RUN)
