"""The link test: pairs of nodes time an all-reduce with the job's backend (gloo here), round by round.

Pairing: for up to ``ALL_PAIRS_MAX`` nodes every pair is tested (a round-robin schedule:
N−1 rounds of disjoint pairs, N rounds for odd N). With every pair measured, a node whose
*every* link is slow while the others have a fast one is the bad node — that localises a
network fault from 3 nodes, where DLRover's two rounds (neighbours, then fastest with
slowest) need 4 and then still cannot always tell. Above that size: DLRover's round 0
(neighbours) and round 1 (fastest with slowest by round 0), plus one more round pairing
every node with a node other than both of its earlier partners, so each node has 3
independent links to judge by.

Each pair builds its own two-rank ``ProcessGroupGloo`` on a prefix of one TCPStore hosted
by node 0 (no job-wide group: a pair connects only its two nodes), warms up, then times
all-reduces of ``PAYLOAD_BYTES`` (``REPEATS`` to ``MAX_REPEATS``, spread over
``SAMPLE_SECONDS``, see ``more_samples``) and keeps the fastest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from launchers.control.reductions import Reducer, Reduction
from launchers.health.priority import raised_priority

ALL_PAIRS_MAX = 8
PAYLOAD_BYTES = 512 << 10  # 0.2 s through a 20 Mbit/s link, about a millisecond through a healthy one
REPEATS = 3  # samples at least; a fast link gets more (``more_samples``)
MAX_REPEATS = 20
SAMPLE_SECONDS = 0.15  # the span a fast link's samples are spread over
SAMPLE_GAP = 0.005  # seconds between two samples
ROUND_BUDGET = 5.0  # seconds a round may take: a pair through a 20 Mbit/s link needs about 1

Pair = tuple[int, int]
Partners = Callable[[float | None, float], dict[str, Any]]  # (my round-0 time, deadline) → {"r1": peer, "r2": peer}
PARTNERS = Reduction.HEALTH_PARTNERS  # the reduction at the hub: ``REDUCERS``, handed to it by the caller


def links_budget(nnodes: int) -> float:
    """Seconds the link rounds of ``nnodes`` may take at most (a round budget per round)."""
    if nnodes <= 1:
        return 0.0
    rounds = len(round_robin(nnodes)) if nnodes <= ALL_PAIRS_MAX else 4
    return rounds * ROUND_BUDGET


def round_robin(nnodes: int) -> list[list[Pair]]:
    """Every pair exactly once, in rounds of disjoint pairs (the circle method)."""
    players: list[int | None] = list(range(nnodes)) + ([None] if nnodes % 2 else [])
    count = len(players)
    rounds = []
    for _ in range(count - 1):
        pairs = []
        for i in range(count // 2):
            a, b = players[i], players[count - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def neighbours(nnodes: int) -> list[Pair]:
    """DLRover's round 0: {0,1}, {2,3}, …; an odd last node pairs with node 0 in a later round."""
    return [(i, i + 1) for i in range(0, nnodes - 1, 2)]


def fastest_with_slowest(times: dict[int, float]) -> list[Pair]:
    """DLRover's round 1: sort the nodes by their round-0 time, pair the ends inwards."""
    order = sorted(times, key=lambda node: (times[node], node))
    pairs = []
    while len(order) >= 2:
        a, b = order.pop(0), order.pop()
        pairs.append((min(a, b), max(a, b)))
    return pairs


def third_partner(nnodes: int, used: set[Pair]) -> list[Pair]:
    """One more round: greedily pair each node with a node it has not been paired with yet."""
    free = list(range(nnodes))
    pairs = []
    while free:
        a = free.pop(0)
        partner = next((b for b in free if (min(a, b), max(a, b)) not in used), None)
        if partner is not None:
            free.remove(partner)
            pairs.append((a, partner))
    return pairs


def _gloo(store: Any, rank: int, timeout: float, ifnames: list[str] | None) -> Any:
    """A two-rank gloo group on ``store``, on GLOO_SOCKET_IFNAME's interfaces when set (as torch does)."""
    import torch.distributed as dist

    wait = timedelta(seconds=max(timeout, 0.5))
    names = ifnames if ifnames is not None else [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    if not names:
        return dist.ProcessGroupGloo(store, rank, 2, wait)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = wait
    options._devices = [dist.ProcessGroupGloo.create_device(interface=name) for name in names]
    return dist.ProcessGroupGloo(store, rank, 2, options)


def more_samples(taken: int, spent: float, best: float, left: float) -> bool:
    """This end's vote, before a timed all-reduce, for one more after it (pure).

    At least ``REPEATS`` samples; then more while they span less than ``SAMPLE_SECONDS`` and
    fewer than ``MAX_REPEATS``, and while one more fits before the round's end. A fast link
    is sampled ~20 times spread over the span, so a burst of load on a busy host (node 0's
    hub, another container) cannot cover every sample and make a healthy link look slow; a
    slow link (hundreds of ms a sample) is still sampled only ``REPEATS`` times.
    ``taken`` counts the samples including the one about to run.
    """
    if taken < REPEATS:
        return True
    return taken < MAX_REPEATS and spent < SAMPLE_SECONDS and left > 2 * best + SAMPLE_GAP


def time_pair(store: Any, key: str, rank: int, deadline: float, ifnames: list[str] | None = None) -> float | None:
    """Seconds of the fastest timed all-reduce with the peer of this pair; None when it failed.

    Both ends must run the same number of all-reduces, yet each decides from its own clock:
    each end's vote for another sample rides in the payload's first element, and the sum
    both ends see after the all-reduce decides for both (another only when both voted for
    one). The pair runs at a raised priority (``raised_priority``; gloo's threads, started
    inside, inherit it), as the compute probe does.
    """
    import torch
    import torch.distributed as dist

    try:
        with raised_priority():
            group = _gloo(dist.PrefixStore(key, store), rank, deadline - time.monotonic(), ifnames)
            group.allreduce([torch.zeros(1)]).wait()
            payload = torch.ones(PAYLOAD_BYTES // 4)
            group.allreduce([payload]).wait()  # warm-up at full size: gloo sizes its buffers on first use
            best, taken, began = float("inf"), 0, time.perf_counter()
            while True:
                taken += 1
                payload.fill_(1.0)
                vote = more_samples(taken, time.perf_counter() - began, best, deadline - time.monotonic())
                payload[0] = float(vote)
                start = time.perf_counter()
                group.allreduce([payload]).wait()
                best = min(best, time.perf_counter() - start)
                if payload[0].item() < 2:
                    return best
                time.sleep(SAMPLE_GAP)
    except RuntimeError:  # connect or collective timed out, peer gone
        return None


def open_store(master_addr: str, port: int, *, host: bool, nnodes: int, timeout: float) -> Any:
    """The TCPStore the pairs meet on: node 0 hosts it, the others connect."""
    import torch.distributed as dist

    return dist.TCPStore(master_addr, port, nnodes, host, timedelta(seconds=max(timeout, 1.0)), wait_for_workers=False)


def run_links(
    node: int,
    nnodes: int,
    store: Any,
    base: float,
    ifnames: list[str] | None = None,
    partners: Partners | None = None,
) -> dict[int, float | None]:
    """This node's part of every round: peer → seconds (None: the pair failed).

    Round ``i`` ends ``(i + 1) × ROUND_BUDGET`` seconds after ``base`` (a moment every node
    shares within milliseconds: the end of the last barrier). A pair waits for its peer
    until then at most, so a node held up by a dead peer in one round starts the next in
    time for its partner there: one dead node costs each round one budget, never a cascade.
    ``ifnames`` (the interfaces gloo uses) overrides GLOO_SOCKET_IFNAME. ``partners`` (the
    control plane's reduction at node 0's hub) tells this node its partners in rounds 1 and 2
    from every node's round-0 time; without it the times are shared on the store (a local
    simulation), each node reading every node's: O(N²) store reads in all.
    """
    links: dict[int, float | None] = {}
    rounds = 0

    def pair_up(round_key: str, pairs: list[Pair]) -> None:
        nonlocal rounds
        rounds += 1
        end = base + rounds * ROUND_BUDGET
        for a, b in pairs:
            if node in (a, b):
                key = f"health/{round_key}/{a}-{b}/"
                links[b if node == a else a] = time_pair(store, key, int(node == b), end, ifnames)

    if nnodes <= ALL_PAIRS_MAX:
        for index, pairs in enumerate(round_robin(nnodes)):
            pair_up(f"r{index}", pairs)
        return links
    pair_up("r0", neighbours(nnodes))
    if partners is not None:
        mine = min((t for t in links.values() if t is not None), default=None)
        try:
            told = partners(mine, base + 1.5 * ROUND_BUDGET)
        except RuntimeError:  # the control plane's ExchangeFailed: a node is missing; its report says so
            return links
        rounds += 1  # the sharing takes a round's slot
        for round_key in ("r1", "r2"):
            peer = told.get(round_key)
            pair_up(round_key, [] if peer is None else [(min(node, int(peer)), max(node, int(peer)))])
        return links
    first = _share(store, node, nnodes, "r0", links, base + 1.5 * ROUND_BUDGET)
    rounds += 1  # the sharing takes a round's slot
    pair_up("r1", fastest_with_slowest(first))
    used = set(neighbours(nnodes)) | set(fastest_with_slowest(first))
    pair_up("r2", third_partner(nnodes, used))
    return links


def later_partners(values: dict[int, Any]) -> tuple[Any, dict[int, Any]]:
    """The hub's reduction: every node's round-0 time (None: no link) → each node its round-1 and round-2 partner."""
    times = {node: float(t) if isinstance(t, (int, float)) else float("inf") for node, t in values.items()}
    nnodes = len(times)
    first = fastest_with_slowest(times)
    second = third_partner(nnodes, set(neighbours(nnodes)) | set(first))
    shares: dict[int, Any] = {node: {"r1": None, "r2": None} for node in times}
    for key, pairs in (("r1", first), ("r2", second)):
        for a, b in pairs:
            shares[a][key], shares[b][key] = b, a
    return {"r1": None, "r2": None}, shares


def _share(
    store: Any, node: int, nnodes: int, round_key: str, links: dict[int, float | None], deadline: float
) -> dict[int, float]:
    """Every node's round time (for round 1's pairing); a node without a link counts as slowest."""
    mine = min((t for t in links.values() if t is not None), default=float("inf"))
    store.set(f"health/{round_key}/time/{node}", repr(mine))
    keys = [f"health/{round_key}/time/{other}" for other in range(nnodes)]
    _wait_keys(store, keys, deadline)
    times = {}
    for other, key in enumerate(keys):
        times[other] = float(store.get(key).decode()) if store.check([key]) else float("inf")
    return times


def _wait_keys(store: Any, keys: list[str], deadline: float, clock: Callable[[], float] = time.monotonic) -> None:
    while clock() < deadline and not store.check(keys):
        time.sleep(0.02)


REDUCERS: dict[str, Reducer] = {PARTNERS.value: later_partners}  # for ``open_job_events(..., reducers=)``


def main(argv: list[str]) -> None:
    """A simulated node's link rounds (``python -m launchers.health.network NODE NNODES PORT SECONDS``).

    A simulation runs one of these per node: gloo's connect holds the interpreter lock, so
    the pairs of one process cannot meet from threads. Prints the links as JSON.
    """
    import json

    node, nnodes, port, seconds = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    store = open_store("127.0.0.1", port, host=False, nnodes=nnodes, timeout=ROUND_BUDGET)
    store.set(f"health/sim/ready/{node}", "1")  # the simulated nodes start the rounds together
    _wait_keys(store, [f"health/sim/ready/{other}" for other in range(nnodes)], time.monotonic() + seconds)
    links = run_links(node, nnodes, store, time.monotonic(), ifnames=["lo"])
    print(json.dumps({str(peer): t for peer, t in links.items()}))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
