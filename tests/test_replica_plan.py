"""Machine-loss replication's decisions (``launchers.persist.replica_plan``): pure functions, no socket.

What a user relies on: after a node loss the survivors commit a step for which every distinct
shard is held by a live node — never one with a shard missing —, the newest such step, and when
there is none (owner and buddy both lost) they say so and fall back.
"""

from __future__ import annotations

from launchers.persist.replica_plan import Holding, Write, decide, next_send, ring, verdict_of, verdict_to_wire


def test_the_ring_sends_each_member_to_the_next_and_re_forms_with_the_membership() -> None:
    assert ring([0, 1, 2]) == {0: 1, 1: 2, 2: 0}
    assert ring([2, 0]) == {0: 2, 2: 0}  # platform indexes, sorted: the generation after node 1 left
    assert ring([0]) == {}


def test_the_stream_takes_the_newest_step_and_skips_what_staged_meanwhile() -> None:
    assert next_send(None, -1) is None
    assert next_send(7, 7) is None
    assert next_send(12, 7) == 12  # 8..11 staged while 7 was on the wire: skipped, never queued


def test_replicated_state_commits_the_survivors_own_newest_step_numbered_as_the_next_job() -> None:
    # 3 nodes × 2 ranks of DDP; node 1 (ranks 2, 3) lost; node 2's ranks 4, 5 become 2, 3.
    holdings = {
        0: Holding(0, own={0: [11, 12], 1: [11, 12]}, renumber={0: 0, 1: 1}, world=6, newest=12),
        2: Holding(2, own={4: [11, 12], 5: [10, 11]}, renumber={4: 2, 5: 3}, world=6, newest=12),
    }
    v = decide(holdings)
    assert (v.how, v.step, v.world, v.lost, v.lost_steps) == ("replicated", 11, 4, (2, 3), 1)
    assert v.writes == {0: [Write(0, 0, "own"), Write(1, 1, "own")], 2: [Write(4, 2, "own"), Write(5, 3, "own")]}


def test_sharded_state_takes_the_lost_nodes_shards_from_its_buddy() -> None:
    # FSDP2 on 3 nodes × 1 rank; node 2 lost, its buddy (node 0) holds steps 10 and 11 of rank 2.
    holdings = {
        0: Holding(0, own={0: [11, 12]}, held={1: [10, 11], 2: [10, 11]}, sharded=True, world=3, newest=12),
        1: Holding(1, own={1: [11, 12]}, held={0: [10, 11]}, sharded=True, world=3, newest=12),
    }
    v = decide(holdings)
    assert (v.how, v.step, v.world, v.lost, v.lost_steps) == ("buddy", 11, 3, (2,), 1)
    assert v.writes == {0: [Write(0, 0, "own"), Write(2, 2, "held")], 1: [Write(1, 1, "own")]}


def test_owner_and_buddy_lost_together_falls_back_and_names_the_ranks() -> None:
    holdings = {0: Holding(0, own={0: [11, 12]}, held={2: [10, 11]}, sharded=True, world=3, newest=12)}
    v = decide(holdings)
    assert (v.how, v.step, v.lost) == ("fallback", None, (1, 2))
    assert "rank(s) 1: their node and its buddy were both lost" in v.reason


def test_a_buddy_copy_of_another_step_than_the_survivors_hold_is_no_checkpoint() -> None:
    holdings = {
        0: Holding(0, own={0: [11, 12]}, held={1: [4, 5]}, sharded=True, world=2, newest=12),
    }
    v = decide(holdings)
    assert v.step is None and v.how == "fallback" and "no step is held for every rank" in v.reason


def test_holdings_and_verdicts_survive_the_wire() -> None:
    h = Holding(3, own={4: [1, 2]}, held={5: [2]}, renumber={4: 0}, sharded=True, world=6, newest=2)
    assert Holding.of(3, h.to_wire()) == h
    v = decide({3: h, 0: Holding(0, own={0: [2], 1: [2], 2: [2], 3: [2], 5: [2]}, sharded=True, world=6, newest=2)})
    wire = verdict_to_wire(v)
    mine = verdict_of(wire["all"], wire["each"]["3"], 3)
    assert (mine.step, mine.how, mine.lost) == (v.step, v.how, v.lost) == (2, "own", ())
    assert mine.writes == {3: [Write(4, 4, "own")]}
