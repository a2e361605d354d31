"""Machine-loss replication's decisions (``launchers.persist.replica_plan``): pure functions, no socket.

What a user relies on: after a node loss the survivors commit a step for which every distinct
shard is held by a live node — never one with a shard missing —, the newest such step, and when
there is none (owner and buddy both lost) they say so and fall back.
"""

from __future__ import annotations

from launchers.control.reductions import reduce_values, result_for
from launchers.persist.replica_plan import (
    ROUND_HOW,
    Holding,
    Round,
    Write,
    decide,
    keep_after,
    ring,
    round_of,
    round_offer,
    verdict_of,
    verdict_to_wire,
)


def test_the_ring_sends_each_member_to_the_next_and_re_forms_with_the_membership() -> None:
    assert ring([0, 1, 2]) == {0: 1, 1: 2, 2: 0}
    assert ring([2, 0]) == {0: 2, 2: 0}  # platform indexes, sorted: the generation after node 1 left
    assert ring([0]) == {}


def agreed(offers: dict[int, dict[str, object]]) -> Round:
    """A round as every node gets it: the offers reduced by the control plane's own reductions."""
    return round_of(result_for(0, *reduce_values(ROUND_HOW, offers)))


def test_a_round_sends_the_oldest_newest_step_and_anchors_the_newest_step_every_node_kept() -> None:
    offers = {0: round_offer(14, [9, 12]), 1: round_offer(13, [9, 12]), 2: round_offer(14, [9])}
    assert agreed(offers) == round_of({"newest": 13, "kept": [9]})  # node 2 has not finished sending 12
    assert agreed(offers).step == 13 and agreed(offers).anchor == 9
    assert agreed({0: round_offer(3, []), 1: round_offer(3, [2])}).anchor is None


def test_a_sender_and_a_buddy_keep_the_anchor_and_the_newest_never_more_than_two() -> None:
    assert keep_after([9, 12, 13], anchor=9) == {9, 13}
    assert keep_after([9, 12, 13], anchor=12, newest=13) == {12, 13}
    assert keep_after([12, 13], anchor=13) == {13}  # the anchor is the newest
    assert keep_after([10, 12, 13], anchor=None) == {12, 13}  # before any anchor: the two newest


def simulate_loss(
    copy_steps: dict[int, int], lost: int, at: int, missed: frozenset[tuple[int, int]] = frozenset()
) -> tuple[int | None, str]:
    """Three nodes training in lockstep, each copy taking ``copy_steps[node]`` steps, rounds as mlaunch runs them
    (``round_offer`` → reduction → ``round_of``, ``keep_after`` at both ends); ``lost`` dies at step ``at``;
    ``missed`` (node, round): that node's copy of that round never arrived (torn, or its link broke).
    Returns the survivors' verdict: the step committed and how."""
    nodes, buddy = sorted(copy_steps), ring(sorted(copy_steps))
    kept: dict[int, set[int]] = {n: set() for n in nodes}  # a sender's copies of its own shard
    store: dict[int, set[int]] = {n: set() for n in nodes}  # a buddy's slots of its predecessor's shard
    step, number = 0, 0
    while True:
        rnd = agreed({n: round_offer(step, kept[n]) for n in nodes})
        for n in nodes:
            kept[n] = keep_after(kept[n], rnd.anchor)
        arrive = {n: step + copy_steps[n] for n in nodes}
        if min(arrive.values()) > at or step > at:
            break
        for n in nodes:
            if arrive[n] <= at and (n, number) not in missed:
                kept[n] = keep_after(kept[n] | {rnd.step}, rnd.anchor, rnd.step)
                held = store[buddy[n]] | {rnd.step}
                store[buddy[n]] = keep_after(held, rnd.anchor, rnd.step)
        if max(arrive.values()) > at:
            break
        step = max(step + 1, max(arrive.values()))  # the next round: once the slowest copy arrived
        number += 1
    shm = {at, at - 1}  # the ranks' two staged slots
    holdings = {}
    for n in [n for n in nodes if n != lost]:
        copies = {lost: sorted(store[n])} if buddy[lost] == n else {}
        holdings[n] = Holding(n, own={n: sorted(shm | kept[n])}, held=copies, sharded=True, world=len(nodes), newest=at)
    verdict = decide(holdings)
    return verdict.step, verdict.how


def test_a_slow_stream_never_makes_a_loss_fall_back_to_the_last_commit() -> None:
    """The case a lagging stream lost everything since the last commit in: node 2's copies take 6 steps; the
    others' 1. Lost at any step, the survivors commit a step every shard is held for, within two rounds."""
    for at in range(8, 40):
        for lost in (0, 1, 2):
            step, how = simulate_loss({0: 1, 1: 1, 2: 6}, lost, at)
            assert how in ("buddy", "own") and step is not None, (at, lost, how)
            assert at - step <= 2 * 6, (at, lost, step)
    step, how = simulate_loss({0: 1, 1: 1, 2: 1}, 2, 30)  # streams that keep up: the step in flight
    assert how == "buddy" and step is not None and 30 - step <= 1, (step, how)


def test_copies_that_never_arrived_leave_the_anchor_every_node_kept() -> None:
    """Node 1's copies of rounds 20 and 21 never arrive: its buddy holds only older ones, so the others must
    still hold their own shards of the newest step node 1's buddy has — the anchor — or a loss of node 1 has
    nothing to commit but the last checkpoint."""
    missed = frozenset({(1, 20), (1, 21)})
    step, how = simulate_loss({0: 1, 1: 1, 2: 1}, 1, 22, missed)
    assert how == "buddy" and step == 19, (step, how)  # round 19's step: the anchor
    step, how = simulate_loss({0: 1, 1: 1, 2: 1}, 1, 23, missed)
    assert how == "buddy" and step == 22, (step, how)  # round 22 reached every buddy: the step in flight again


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
