"""The fault schedule of a chaos storm: a pure function of the seed (``python -m benchmarks.chaos``).

``draw(seed, count, ...)`` returns the faults in order, each with the gap since the previous
one, its class, its target host and how long it lasts. Nothing here touches a process: the same
seed gives the same list on any machine, so a storm that found a bug can be replayed.

The schedule models the membership the way the design decides it, so that every fault it draws
can be injected: a node lost (its mlaunch killed, its link down past ``node_timeout``, its
mlaunch preempted) is out until a ``comeback`` restarts its mlaunch; a fault that would take the
job below MIN is put off until the node that is out came back (the comeback is drawn first, then
the fault). Node 0 is no exception (issue 45: the hub moves): ``kill_mlaunch_node0`` and
``preempt_node0`` are node losses of host 0 — the job shrinks, host 0 is out until a drawn
``comeback`` starts its mlaunch again with its same environment, as a platform restarting its pod,
and it joins the moved hub as a candidate. Only a SIGTERM to every node (``term_all``) ends the job
by design; the harness restarts it whole. A same-membership storm draws no node loss.

A comeback of host 0 comes at least ``NODE0_COMEBACK_FLOOR`` (3 s) after its loss: a node 0
restarted before the survivors moved the hub (they judge a killed hub silent 1.5 s after its
connection closed) finds no hub elsewhere and hosts one of its own — a known limitation
(docs/elastic-membership.md); a real platform takes seconds to restart a pod. The floor is kept
here, in the schedule's gaps: the storm fires each fault no sooner than its gap after the previous
one was fired, so the time between two faults is never shorter than the sum of the gaps between
them. A comeback lifted to the floor is not counted as nested.

Every class is drawn once (shuffled) before any twice, so a short storm has them all; the comebacks
that node losses need first come in between (on 3 hosts with MIN 2, about 15 faults hold every class).
A share ``nested`` of the faults comes 0.2–1.5 s after the previous one: inside its recovery.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

# every class, in the report's order
CLASSES: tuple[str, ...] = (
    "kill_rank",  # kill -9 of one rank
    "kill_standby",  # kill -9 of one warm standby (or the warm parent)
    "hang",  # one rank stops inside a step; the others block in its collective
    "link_flap",  # a host's link down for less than node_timeout
    "slow_node",  # a host's processes throttled to 50 % of a CPU (cgroup cpu quota)
    "disk_full",  # the checkpoint filesystem full for a while
    "kill_mlaunch",  # kill -9 of a member node's mlaunch (not node 0): the job shrinks
    "link_down",  # a member's link down for longer than node_timeout: the job shrinks
    "preempt",  # SIGTERM to a member node's mlaunch (not node 0): it leaves gracefully
    "comeback",  # a node that was lost: its mlaunch started again (a candidate, then admitted)
    "kill_mlaunch_node0",  # kill -9 of node 0's mlaunch: the hub moves, the job shrinks
    "preempt_node0",  # SIGTERM to node 0's mlaunch: it hands the hub over and leaves gracefully
    "term_all",  # SIGTERM to every node's mlaunch (the platform stops the job), restarted whole
)
NODE0_LOSS = frozenset({"kill_mlaunch_node0", "preempt_node0"})  # node losses of host 0 (the hub moves)
NODE_LOSS = frozenset({"kill_mlaunch", "link_down", "preempt"}) | NODE0_LOSS  # the host is out until a comeback
WHOLE_JOB = frozenset({"term_all"})  # the job ends by design: the harness restarts every host
# faults after which the job trains on at another size for a while
RESIZES = NODE_LOSS | {"comeback"}
NODE0_COMEBACK_FLOOR = 3.0  # seconds from host 0's loss to its comeback at the soonest (the module's docstring)
# faults after which the job trains on with the same nodes: the final parameters must equal a fault-free run's
SAME_MEMBERSHIP: tuple[str, ...] = tuple(c for c in CLASSES if c not in RESIZES)
WEIGHTS = {
    "kill_rank": 3,
    "kill_standby": 2,
    "hang": 1,
    "link_flap": 2,
    "slow_node": 2,
    "disk_full": 2,
    "kill_mlaunch": 2,
    "link_down": 1,
    "preempt": 2,
    "comeback": 4,
    "kill_mlaunch_node0": 1,
    "preempt_node0": 1,
    "term_all": 1,
}


@dataclass(frozen=True)
class Fault:
    index: int
    gap: float  # seconds after the previous fault was injected
    kind: str
    host: int  # target host (0-based); -1: every host
    duration: float  # seconds the condition lasts (link down, throttle, full disk); 0: instant
    nested: bool  # drawn to land inside the previous fault's recovery

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class _Model:
    hosts: int
    min_nodes: int
    out: set[int]
    lost_at: dict[int, float] = field(default_factory=dict)  # host → schedule time of its loss

    def feasible(self, kind: str) -> bool:
        if kind == "comeback":
            return bool(self.out)
        if kind in NODE0_LOSS and 0 in self.out:
            return False
        if kind in NODE_LOSS:
            in_job = self.hosts - len(self.out)
            return in_job - 1 >= self.min_nodes
        return True

    def target(self, kind: str, rng: random.Random) -> int:
        if kind == "comeback":
            return min(self.out)
        if kind in NODE0_LOSS:
            return 0
        if kind in NODE_LOSS:
            return rng.choice(sorted(set(range(1, self.hosts)) - self.out))
        if kind in ("term_all", "disk_full"):
            return -1
        return rng.choice(sorted(set(range(self.hosts)) - self.out))

    def apply(self, kind: str, host: int, clock: float) -> None:
        if kind == "comeback":
            self.out.discard(host)
        elif kind in NODE_LOSS:
            self.out.add(host)
            self.lost_at[host] = clock
        elif kind in WHOLE_JOB:
            self.out.clear()

    def soonest(self, kind: str, host: int, clock: float) -> float:
        """The shortest gap after the fault fired at ``clock`` for this one: host 0's comeback keeps the floor."""
        if kind == "comeback" and host == 0 and 0 in self.lost_at:
            return NODE0_COMEBACK_FLOOR - (clock - self.lost_at[0])
        return 0.0


def duration(kind: str, rng: random.Random, node_timeout: float) -> float:
    if kind == "link_down":
        return node_timeout + rng.uniform(1.0, 3.0)
    if kind == "link_flap":
        return node_timeout * rng.uniform(0.2, 0.5)
    if kind == "slow_node":
        return rng.uniform(3.0, 6.0)
    if kind == "disk_full":
        return rng.uniform(2.0, 5.0)
    return 0.0


def kinds_in_order(rng: random.Random, count: int, classes: Sequence[str]) -> list[str]:
    """Every class once (shuffled), then classes drawn by weight."""
    first = list(classes)
    rng.shuffle(first)
    weights = [WEIGHTS.get(c, 1) for c in classes]
    rest = rng.choices(list(classes), weights=weights, k=max(0, count - len(first)))
    return (first + rest)[:count] if count >= len(first) else first[:count]


def draw(
    seed: int,
    count: int,
    *,
    spacing: float = 5.0,
    nested: float = 0.2,
    hosts: int = 3,
    min_nodes: int = 2,
    node_timeout: float = 3.0,
    classes: Sequence[str] = CLASSES,
) -> list[Fault]:
    """``count`` faults: mean gap ``spacing`` s, a share ``nested`` of them 0.2–1.5 s after the previous one."""
    if not 0.0 <= nested < 1.0 or spacing <= 0 or count < 0:
        raise ValueError("need spacing > 0, 0 ≤ nested < 1, count ≥ 0")
    rng = random.Random(seed)
    model = _Model(hosts, min_nodes, set())
    near = 0.85  # mean of uniform(0.2, 1.5)
    far = max(0.5, (spacing - nested * near) / (1.0 - nested))  # keeps the mean gap at ``spacing``
    pending = kinds_in_order(rng, count, classes)
    faults: list[Fault] = []
    clock = 0.0  # schedule time of the previous fault: the sum of the gaps
    for _ in range(100 * count + 100):
        if len(faults) >= count:
            break
        if not pending:
            pending = rng.choices(list(classes), weights=[WEIGHTS.get(c, 1) for c in classes], k=count - len(faults))
        kind = pending.pop(0)
        if not model.feasible(kind):
            if kind == "comeback" or "comeback" not in classes:
                continue  # nothing is out / nothing can come back: the class is drawn again later by chance
            pending[:0] = ["comeback", kind]  # bring the lost node back first, then this fault
            continue
        is_nested = bool(faults) and rng.random() < nested
        gap = rng.uniform(0.2, 1.5) if is_nested else far * rng.uniform(0.5, 1.5)
        host = model.target(kind, rng)
        soonest = model.soonest(kind, host, clock)
        if gap < soonest:  # up to the next millisecond: the rounding below must not undercut the floor
            gap, is_nested = math.ceil(soonest * 1000) / 1000, False
        gap = round(gap, 3)
        clock += gap
        faults.append(Fault(len(faults), gap, kind, host, round(duration(kind, rng, node_timeout), 3), is_nested))
        model.apply(kind, host, clock)
    return faults


def counts(faults: Sequence[Fault]) -> dict[str, int]:
    return {c: sum(1 for f in faults if f.kind == c) for c in CLASSES if any(f.kind == c for f in faults)}
