"""An elastic job's attempts: it goes on at a smaller size when a node leaves, and takes nodes back (issue 27).

With ``pytorch.nnodes: "MIN:MAX"`` and one mlaunch per node, this is the restart loop's
membership policy (``run/restarts.py``). Before every generation the members meet at node 0's hub
(``JobEvents.meet``):
the meeting's answer is the membership the generation runs with (the platform's node indexes;
a member's node rank is its position among them, ``platform.resize``), who left since the last
meeting, who is admitted, and the job's restart count. Then, per generation:

1. the health check when every platform node is in the job (it numbers nodes as the platform
   does); a node it excludes exits 75, the others meet again without it;
2. the plan of the resized cluster (``RANK``/``WORLD_SIZE``/``NODE_RANK``, the rendezvous port of
   the generation, the platform's shape variables restated), and the attempt;
3. after it: a node that left (``Left``), node 0's regroup (``Regroup``) or a failure; the
   next meeting says which. A change of membership does not count against
   ``restart.max_restarts`` and waits no backoff; a failure does, and the job gives up when
   they are spent — every node decides from the same meeting (the restart loop applies it),
   so they decide alike.

A node whose mlaunch starts while the job runs is a candidate: it starts no ranks, says so, and
waits to be admitted (``elastic.grow``: at the next meeting, or node 0 makes one right after the
next committed checkpoint). No node is special: when the node hosting the hub (node 0 at first) is
lost, the hub and the rendezvous master move to the lowest surviving member (``control.succession``)
and the meeting there re-forms the job as after any node's loss.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from launchers import stop_signals as early_signals
from launchers.control import ExchangeFailed, HubMovedAway, Meeting, topics
from launchers.log import say
from launchers.outcome import signal_name
from launchers.phases import long_phase
from launchers.planning import plan_attempt
from launchers.platform.resize import resize
from launchers.run.restarts import Gathered, Generation

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.control import JobEvents
    from launchers.engines.base import Engine
    from launchers.health.check import HealthOutcome
    from launchers.observe.observer import JobObserver
    from launchers.plan import LaunchPlan
    from launchers.platform.cluster import Cluster
    from launchers.run.attempt import RunContext

MEET_AFTER_FAILURE = 5.0  # seconds past node_timeout the members wait for each other before a generation


class ElasticMembership:
    """The restart loop's policy for an elastic job: meet before every generation, at the size the meeting says."""

    def __init__(
        self,
        job: Job,
        engine: Engine[Cluster],
        platform: Cluster,
        span: tuple[int, int],
        run: RunContext,
        first: LaunchPlan,
    ) -> None:
        self.job, self.engine, self.platform, self.span, self.run = job, engine, platform, span, run
        self.events: JobEvents = run.events
        self.observer: JobObserver = run.observer
        self.first_plan: LaunchPlan | None = (
            first  # the platform's plan of attempt 0 (a candidate warms standbys for it)
        )
        self.members: tuple[int, ...] = ()
        self.restarts = 0
        self.grow: GrowPoint | None = None
        if job.elastic.grow == "at_checkpoint":  # acts where the hub runs: node 0, or the node it moved to
            self.grow = GrowPoint(self.events, self.observer)

    def start(self) -> Generation | int:
        joined = _join(self)
        return joined if isinstance(joined, int) else _form(self, joined)

    def tick(self) -> None:
        if self.grow is not None:
            self.grow.tick()

    def attempt_ended(self) -> None:
        _say_if_node0_lost(self.events)

    def gather(self, attempt: int, code: int) -> Gathered | int:
        meeting = _meet(self, topics.meeting(attempt), attempt, _meeting_wait(self.job), failed=code)
        if isinstance(meeting, int):
            return meeting
        return Gathered(reformed=bool(meeting.left or meeting.regroup), restarts=meeting.restarts, detail=meeting)

    def form(self, attempt: int, gathered: Gathered, code: int) -> Generation | int:
        meeting = gathered.detail
        assert isinstance(meeting, Meeting), meeting
        return _form(self, meeting)


NODE0_LOST = (
    "the control plane's hub (node {hub}) is lost and could not move to another node: the nodes left would "
    "be fewer than the elastic minimum or hold no strict majority of the last membership (the others may "
    "be going on without this node), or the platform names no host list to move it to; the job ends here "
    "— if the others go on, this node can rejoin by starting its mlaunch again"
)


def _say_if_node0_lost(events: JobEvents) -> None:
    """The hub lost and it could not move (``control.succession``): why the range does not help here."""
    lost = events.lost
    if lost is not None and not lost.out and lost.node != events.node and lost.host.startswith("the master"):
        say(NODE0_LOST.format(hub=lost.node))


def _meeting_wait(job: Job) -> float:
    """How long the members wait for each other after an attempt: one may still be stopping gracefully
    (a regroup gives its ranks the grace period for their dying save), one that is gone is found by then."""
    return MEET_AFTER_FAILURE + _node_timeout(job) + job.checkpoint.grace_period


def _node_timeout(job: Job) -> float:
    from launchers.control import node_timeout

    return node_timeout(job)


def _join(elastic: ElasticMembership) -> Meeting | int:
    """This node's place: a member meets the others for generation 0; a candidate waits to be admitted."""
    job, events = elastic.job, elastic.events
    deadline = time.monotonic() + max(job.monitor.join_timeout, _node_timeout(job))
    with long_phase("joining the job's control plane"):
        if not events.joined(deadline):
            say(f"job failed: {events.lost.describe() if events.lost else 'node 0 never answered'}; exit code 1")
            return 1
    if not events.candidate:
        admitted = events.admission(0.0)
        if admitted is not None:  # welcomed as a candidate and admitted by a meeting before this line ran
            say(f"node {events.node}: admitted to the job at generation {admitted.generation}")
            return admitted
        try:
            return _meet(elastic, topics.meeting(0), 0, deadline - time.monotonic())
        except HubMovedAway:  # this node's mlaunch started again before the others moved the hub: join theirs
            events.join_moved_hub()
            return _join(elastic)
    when = "the job's next restart" if job.elastic.grow == "at_restart" else "the next committed checkpoint"
    say(
        f"node {events.node}: the job is already running; this node starts no ranks and waits to be admitted "
        f"at {when} (elastic.grow: {job.elastic.grow}; up to {elastic.span[1]} nodes)"
    )
    elastic.observer.waiting_to_join()
    since, said_ready = time.monotonic(), False
    while True:
        _warm_standbys(elastic)  # admitted, its ranks start from them: not seconds after the others'
        why = ready_to_join(elastic, time.monotonic() - since)
        if why is not None:
            events.ready()  # said again each pass: a hub that started over hears it too
            if not said_ready:
                said_ready = True
                say(f"node {events.node}: {why}; ready to be admitted")
        meeting = events.admission(0.5)
        if meeting is not None:
            say(f"node {events.node}: admitted to the job at generation {meeting.generation}")
            return meeting
        stop = [s for s in elastic.run.signals.wait(0.0) if s in early_signals.STOP_SIGNALS]
        if stop:
            say(f"stopped by {signal_name(stop[0])} while waiting to join")
            return 128 + stop[0]
        if events.lost is not None:
            say(f"job failed: {events.lost.describe()} before this node was admitted; exit code 1")
            return 1
        if events.ended is not None:
            code = events.ended.exit_code
            say(f"{events.ended.describe()} before this node was admitted; exit code {code}")
            return code


READY_AT_MOST = 20.0  # seconds a candidate waits for its standbys before it says ready anyway


def ready_to_join(elastic: ElasticMembership, waited: float) -> str | None:
    """Why this candidate may be admitted now (its ranks would start warm), or None: not yet.

    Node 0's grow at a checkpoint re-forms only for a ready candidate (``events.ready``): admitted
    while its standbys still import ``preload``, its ranks started cold and the whole job waited
    for them (4.3 s a grow in a chaos storm, against 0.2 s for a restart from warm standbys).
    """
    pool, plan = elastic.run.standbys, elastic.first_plan
    if pool is None or plan is None:
        return "no standbys to warm"
    wanted = sum(1 for spec in plan.processes if pool.compatible(spec))
    if pool.ready_count() >= wanted:
        return f"{wanted} warm standby workers ready"
    if waited >= READY_AT_MOST:
        return f"standbys not warm after {READY_AT_MOST:g}s (the ranks may start cold)"
    return None


def _warm_standbys(elastic: ElasticMembership) -> None:
    """A candidate's standbys (``preload``), started while it waits: its ranks start warm when admitted."""
    pool, plan = elastic.run.standbys, elastic.first_plan
    if pool is None or plan is None:
        return
    try:
        pool.maintain()
        if pool.missing(plan.processes):
            pool.fill(plan.processes, os.getpid())
    except OSError as exc:  # standbys must never keep a node from joining
        say(f"cannot start standby workers: {exc}")
        elastic.run.standbys = None


def _meet(
    elastic: ElasticMembership, key: str, generation: int, wait: float, admit: bool = True, failed: int = 1
) -> Meeting | int:
    """Every member's meeting before ``generation``; else the exit code (``failed``), said why.

    The job may end while the members meet: a member that finished the job's training (its
    mlaunch ended with 0) cannot come, and the hub ends the job with code 0 instead.
    """
    events = elastic.events
    try:
        with long_phase("waiting for every node before the restart" if generation else "waiting for every node"):
            return events.meet(key, generation, elastic.restarts, time.monotonic() + wait, admit=admit)
    except ExchangeFailed as exc:
        ended = events.ended
        if ended is not None and ended.exit_code == 0:
            say(f"job finished: {ended.describe()}")
            return 0
        say(f"job failed: cannot {'restart' if generation else 'start'} together: {exc}")
        return failed


def _form(elastic: ElasticMembership, meeting: Meeting) -> Generation | int:
    """The generation's plan on the meeting's membership (after the health check and its exclusions)."""
    job, events, platform = elastic.job, elastic.events, elastic.platform
    attempt = meeting.generation
    counted = meeting.restarts + (0 if (meeting.left or meeting.regroup or not attempt) else 1)
    events.start_generation(attempt)
    members = meeting.members
    if job.health_check.before_start:
        checked = _health(elastic, meeting)
        if isinstance(checked, int):
            return checked
        members = checked.members
        meeting = checked
    before = elastic.members if elastic.members else _before(meeting)  # a node just admitted knows it from the meeting
    elastic.members = members
    elastic.restarts = counted
    cluster = elastic.engine.restart_cluster(resize(platform, members), attempt)
    plan = plan_attempt(elastic.engine, job, cluster, attempt)
    if members != before:
        _announce(elastic, meeting, before, plan)
    if elastic.grow is not None:
        elastic.grow.new_generation()
    return Generation(plan, attempt)


def _before(meeting: Meeting) -> tuple[int, ...]:
    """The membership before the meeting: its members less the admitted, with those who left."""
    joined = {node for node, _ in meeting.joined}
    return tuple(sorted({n for n in meeting.members if n not in joined} | {x.node for x in meeting.left}))


def _health(elastic: ElasticMembership, meeting: Meeting) -> Meeting | int:
    """The health check when every platform node is in the job; after an exclusion, a second meeting without them."""
    job, events, platform = elastic.job, elastic.events, elastic.platform
    if list(meeting.members) != list(range(platform.nnodes)):
        say(
            f"health check: skipped before generation {meeting.generation}: {len(meeting.members)} of the "
            f"platform's {platform.nnodes} nodes are in the job (the check numbers nodes as the platform does)"
        )
        return meeting
    from launchers.health.gate import before_start

    bad: list[int] = []

    def seen(outcome: HealthOutcome) -> None:
        elastic.observer.health(outcome)
        bad.extend(v.index for v in outcome.bad)

    refused = before_start(job, platform, events, seen)
    if refused is not None:
        return refused
    if not bad:
        return meeting
    return _meet(elastic, topics.meeting_after_health(meeting.key), meeting.generation, _meeting_wait(job), False)


def _announce(elastic: ElasticMembership, meeting: Meeting, before: tuple[int, ...], plan: LaunchPlan) -> None:
    """Say and record who left and who joined, and the size before and after."""
    procs = elastic.platform.procs_per_node
    left = ", ".join(f"{x.node}{f' ({x.host})' if x.host else ''}: {x.why}" for x in meeting.left) or "none"
    joined = ", ".join(f"{n}{f' ({h})' if h else ''}" for n, h in meeting.joined) or "none"
    say(
        f"membership (generation {meeting.generation}): {len(before)} → {len(meeting.members)} nodes "
        f"({len(before) * procs} → {plan.world_size} ranks); nodes in the job: "
        f"{', '.join(map(str, meeting.members))}; left: {left}; joined: {joined}"
    )
    elastic.observer.membership(meeting, list(before), procs)


class GrowPoint:
    """``elastic.grow: at_checkpoint``: a ready candidate waits → regroup once a newer step is committed.

    Every node holds one; only the node hosting the hub sees candidates (``ready_to_join``), so it acts
    there: node 0, or the node the hub moved to (``control.succession``)."""

    def __init__(self, events: JobEvents, observer: JobObserver) -> None:
        self.events = events
        self.observer = observer
        self.since: dict[int, int] = {}  # candidate → the newest committed step when it was first seen waiting
        self.asked = False

    def new_generation(self) -> None:
        self.asked = False
        self.since.clear()

    def tick(self) -> None:
        if self.asked:
            return
        waiting = self.events.ready_to_join()  # a candidate still warming its standbys is left to warm
        if not waiting:
            return
        step = self.observer.committed_step
        for node in waiting:
            self.since.setdefault(node, step)
        if any(step > self.since[node] for node in waiting):
            self.asked = True
            names = ", ".join(map(str, waiting))
            why = (
                f"node(s) {names} wait to join and step {step} is committed (elastic.grow: at_checkpoint): "
                "every node stops its ranks gracefully and the job re-forms with them"
            )
            say(why)
            self.events.regroup(why)
