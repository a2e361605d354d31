"""The pure parts of the chaos storm harness (the package benchmarks/chaos/): the schedule, the parser, the report.

No process, no clock: the schedule is a function of the seed, the report a function of the
observations. The storm itself runs in tests/test_chaos_storm.py (netns, slow).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks.chaos.observe import Event, parse  # noqa: E402
from benchmarks.chaos.report import build, frontier_at, losses, lost_steps, pace  # noqa: E402
from benchmarks.chaos.schedule import (  # noqa: E402
    CLASSES,
    NODE0_COMEBACK_FLOOR,
    NODE0_LOSS,
    NODE_LOSS,
    SAME_MEMBERSHIP,
    WHOLE_JOB,
    draw,
)
from benchmarks.chaos.storm import Storm  # noqa: E402


def test_the_schedule_is_a_function_of_the_seed() -> None:
    assert draw(7, 40) == draw(7, 40)
    assert draw(7, 40) != draw(8, 40)


@pytest.mark.parametrize("seed", range(20))
def test_a_short_schedule_has_every_class_and_never_takes_the_job_below_min(seed: int) -> None:
    """Node 0 is no exception (issue 45: the hub moves): its loss takes host 0 out like a member's, until a
    comeback of host 0; only SIGTERM to every node ends the job."""
    faults = draw(seed, 20, hosts=3, min_nodes=2)
    assert {f.kind for f in faults} == set(CLASSES)
    assert {"term_all"} == WHOLE_JOB
    out: set[int] = set()
    for fault in faults:
        if fault.kind in NODE_LOSS:
            assert (fault.host == 0) == (fault.kind in NODE0_LOSS) and fault.host not in out
            out.add(fault.host)
            assert 3 - len(out) >= 2
        elif fault.kind == "comeback":
            assert fault.host in out
            out.discard(fault.host)
        elif fault.kind in WHOLE_JOB:
            out.clear()
        elif fault.host >= 0:
            assert fault.host not in out  # a fault on a host that is out would do nothing


def test_host_0_lost_is_out_and_comes_back_no_sooner_than_the_floor() -> None:
    """A node 0 restarted before the survivors moved the hub (1.5 s after a kill) would host a hub of its own (a
    known limitation; a platform takes seconds to restart a pod): the schedule keeps 3 s between host 0's loss and
    its comeback. The storm fires each fault no sooner than its gap after the previous, so the gaps' sum bounds it."""
    seen = lifted = 0
    for seed in range(60):
        faults = draw(seed, 60, hosts=3, min_nodes=2, spacing=2.0, nested=0.5)
        lost: float | None = None
        clock = 0.0
        for fault in faults:
            clock += fault.gap
            if fault.kind in NODE0_LOSS:
                assert lost is None  # host 0 is out: it is not lost again before it came back
                lost = clock
            elif fault.kind == "comeback" and fault.host == 0:
                assert lost is not None and clock - lost >= NODE0_COMEBACK_FLOOR - 1e-6, (seed, fault)
                seen += 1
                lifted += clock - lost < NODE0_COMEBACK_FLOOR + 1e-3  # the floor decided this gap
                lost = None
            elif fault.kind == "term_all":
                lost = None
            elif lost is not None and fault.host == 0:
                raise AssertionError(f"seed {seed}: {fault} hits host 0 while it is out")
    assert seen > 50 and lifted > 5  # the floor is what kept several of them (nested draws of 0.2–1.5 s)


def test_the_spacing_and_the_nested_share_are_what_was_asked() -> None:
    faults = draw(3, 2000, spacing=5.0, nested=0.25)
    gaps = [f.gap for f in faults[1:]]
    assert 4.7 < sum(gaps) / len(gaps) < 5.3
    nested = [f for f in faults if f.nested]
    assert 0.2 < len(nested) / len(faults) < 0.3
    assert all(0.2 <= f.gap <= 1.5 for f in nested)


def test_a_same_membership_schedule_has_no_node_loss() -> None:
    faults = draw(5, 50, classes=SAME_MEMBERSHIP)
    assert {f.kind for f in faults} == set(SAME_MEMBERSHIP)
    assert not any(f.kind in NODE_LOSS or f.kind == "comeback" for f in faults)
    assert not any(f.kind in NODE0_LOSS for f in faults)  # the hub moves: a shrink


def test_lines_are_parsed_with_their_stamps() -> None:
    assert parse(1, 9.0, "[rank 2] chaos pid 2 4711") == Event("pid", 1, 9.0, (2, 4711))
    assert parse(0, 9.0, "[rank 0] chaos step 17 123.5") == Event("step", 0, 123.5, (17,))
    assert parse(0, 9.0, "[rank 0] chaos resumed 15 124.0 4") == Event("resumed", 0, 124.0, (15, 4))
    assert parse(0, 9.0, "[rank 0] chaos resumed -1 1.0 6") == Event("resumed", 0, 1.0, (-1, 6))
    assert parse(0, 9.0, "[rank 0] chaos final 99 abc123") == Event("final", 0, 9.0, (99, "abc123"))
    line = "mlaunch: membership (generation 2): 3 → 2 nodes (6 → 4 ranks); nodes in the job: 0, 1"
    assert parse(2, 5.0, line) == Event("membership", 2, 5.0, (2, 3, 2))
    assert parse(0, 1.0, "mlaunch: persisted step 10 in the background") is None


def steps(pairs: list[tuple[int, float]], host: int = 0) -> list[Event]:
    return [Event("step", host, t, (s,)) for s, t in pairs]


def fault(index: int, stamp: float, kind: str = "kill_rank", committed: int | None = 10, nested: bool = False) -> dict:
    return {"index": index, "stamp": stamp, "kind": kind, "committed": committed, "nested": nested, "done": "x"}


def test_committed_steps_lost_compare_each_resume_with_the_commit_before_its_fault() -> None:
    events = [Event("resumed", 0, 1.0, (-1, 6)), Event("resumed", 0, 5.0, (12, 6)), Event("resumed", 0, 9.0, (15, 4))]
    faults = [fault(0, 4.0, committed=12), fault(1, 8.0, committed=20)]
    found = lost_steps(events, faults)
    assert [(r["resumed"], r["committed_before"], r["lost"]) for r in found] == [(12, 12, 0), (15, 20, 5)]


def test_wall_time_lost_counts_steps_done_again() -> None:
    events = steps([(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (2, 6.0), (3, 7.0), (4, 8.0), (5, 9.0)])
    assert pace(events) == 1.0 and frontier_at(events, 6.5) == 3
    # a fault at 3.5: window to 9.0 made steps 4 and 5 only (2 and 3 were done again)
    assert losses(events, [fault(0, 3.5)], 1.0, 9.0) == [5.5 - 2.0]


def test_the_report_counts_classes_and_compares_final_parameters() -> None:
    storm_events = steps([(s, float(s)) for s in range(20)]) + [Event("final", 0, 20.0, (19, "aa"))]
    storm_events.append(Event("resumed", 0, 6.0, (5, 6)))
    storm = {
        "events": storm_events,
        "faults": [fault(0, 5.0, committed=5), fault(1, 10.0, "hang", committed=9)],
        "unrecoverable": [],
        "restarts": [],
        "exits": [],
        "leftovers": {"processes": 0, "shm": 0, "partial": 0},
    }
    baseline = {"events": steps([(s, s * 0.5) for s in range(20)]) + [Event("final", 0, 10.0, (19, "aa"))]}
    report = build(storm, baseline, min_nodes=2, spacing=5.0, seed=1)
    assert report["faults"]["kill_rank"] == 1 and report["faults"]["hang"] == 1
    assert report["committed_steps_lost"] == 0 and report["step_time_s"] == 0.5
    assert report["same_membership"] and report["final_equal_to_fault_free"] is True
    assert 0.0 < report["step_efficiency"] <= 1.0


def test_a_rank_fault_whose_host_has_no_rank_hits_a_host_that_has_one() -> None:
    """CI: kill_rank was drawn for a node that had just come back and waited as a candidate (no rank) for 60 s
    on a loaded machine; the fault was never injected. Now it hits a host whose rank lives (this process
    stands in for that rank: ``live_ranks`` asks the kernel whether the pid exists)."""
    import os
    import random
    from pathlib import Path
    from types import SimpleNamespace

    from benchmarks.chaos.inject import Injector
    from benchmarks.chaos.schedule import Fault

    running = {0, 1, 2}
    cluster = SimpleNamespace(hosts=[None] * 3, running=lambda h: h in running)
    injector = Injector(cluster, Path("/nonexistent"), Path("/nonexistent"), random.Random(1))
    drawn = Fault(3, 1.0, "kill_rank", 1, 0.0, False)
    assert not injector.target_ready(drawn) and injector.retarget(drawn) is None  # no rank anywhere: it waits
    injector.saw_pid(2, 0, os.getpid())
    moved = injector.retarget(drawn)
    assert moved is not None and (moved.kind, moved.host, moved.index) == ("kill_rank", 2, 3)
    assert injector.target_ready(moved)
    injector.saw_pid(0, 1, os.getpid())  # host 0 printed a pid, then its mlaunch was lost (the hub moved)
    running.discard(0)
    assert not injector.target_ready(Fault(5, 1.0, "hang", 0, 0.0, False))  # a host that is out has no rank
    assert injector.retarget(drawn) == moved  # host 0 is no other choice while it is out
    assert injector.retarget(Fault(4, 1.0, "kill_mlaunch", 1, 0.0, False)) is None  # a node's fault stays on it


def test_a_node_loss_waits_until_every_started_mlaunch_is_in_the_job() -> None:
    """The 100-fault rerun: a comeback's mlaunch took 12 s to reach the hub; the next preemption left one
    node, below MIN, and the job ended by design, which the schedule promises never to cause. A node-loss
    fault now waits until every running mlaunch is a member (``test_a_node_loss_waits_until_every_running_…``)."""
    import random
    from pathlib import Path
    from types import SimpleNamespace

    from benchmarks.chaos.inject import Injector
    from benchmarks.chaos.observe import says_in_job
    from benchmarks.chaos.schedule import Fault

    running = {0, 1, 2}
    cluster = SimpleNamespace(hosts=[None] * 3, in_job={0, 2}, members={0, 2}, running=lambda h: h in running)
    injector = Injector(cluster, Path("/nonexistent"), Path("/nonexistent"), random.Random(1))
    preempt = Fault(29, 1.0, "preempt", 2, 0.0, False)
    assert not injector.target_ready(preempt)  # host 1 came back but is not in the job yet
    line = "mlaunch: node 1: the job is already running; this node starts no ranks and waits to be admitted"
    assert says_in_job(line) and not says_in_job("mlaunch: control plane: node 1 of 3 joining x:7666")
    cluster.in_job.add(1)
    cluster.members.add(1)
    assert injector.target_ready(preempt)
    running.discard(1)  # a host that is down does not hold the fault back
    cluster.in_job.discard(1)
    cluster.members.discard(1)
    assert injector.target_ready(preempt)


def test_a_node_loss_waits_until_every_running_mlaunch_is_a_member() -> None:
    """A 30-fault storm (seed 38): node 1 hosted the hub since node 0's loss, nodes 1 and 2 were the members and node
    0, back, waited as a candidate; node 1's link cut left node 2 with 1 of the 2 members, no strict majority to move
    the hub (no split brain), node 1 alone below MIN, and every mlaunch ended 1 — by design, not a fault the job
    survives. The 300-fault storm (seed 37) did the same with a kill: node 0 killed 0.7 s after node 1 came back
    (members 0, 2): node 2 alone, below MIN (a candidate does not count), ended 1, four times. Any node's loss (it
    may hold the hub) now waits until every running mlaunch is a member."""
    import random
    from types import SimpleNamespace

    from benchmarks.chaos.inject import Injector
    from benchmarks.chaos.observe import says_member
    from benchmarks.chaos.schedule import Fault

    running = {0, 1, 2}
    cluster = SimpleNamespace(hosts=[None] * 3, in_job={0, 1, 2}, members={1, 2}, running=lambda h: h in running)
    injector = Injector(cluster, Path("/nonexistent"), Path("/nonexistent"), random.Random(1))  # type: ignore[arg-type]
    cut = Fault(16, 1.0, "link_down", 1, 5.1, False)
    assert not injector.target_ready(cut)
    assert not injector.target_ready(Fault(12, 1.0, "kill_mlaunch_node0", 0, 0.0, False))
    waits = "mlaunch: node 0: the job is already running; this node starts no ranks and waits to be admitted"
    assert not says_member(waits) and says_member("mlaunch: node 0: admitted to the job at generation 6")
    assert says_member("mlaunch: engine pytorch  world size 6  nodes 3  master x:6666")
    cluster.members.add(0)
    assert injector.target_ready(cut) and injector.target_ready(Fault(12, 1.0, "kill_mlaunch_node0", 0, 0.0, False))


def test_a_storms_picture_joins_its_runs_across_the_harnesss_whole_job_restarts() -> None:
    """A storm restarts the whole job after node 0 is lost: each run starts at attempt 0 and ends with its
    own end event, and the timeline draws a log directory's newest run. The storm's picture once showed
    its last 27 s of 94 (one fault of 13); joined, it spans every run, attempts numbered on, each earlier
    run's end a whole-job restart, the goodput from the whole storm's events."""
    from benchmarks.chaos.png import WHOLE_JOB_RESTART, joined
    from launchers.observe import timeline_costs, timeline_model

    def run(t0: float, steps: int) -> list[dict]:
        """One run of the job: attempt 0 steps, a rank fails, attempt 1 steps, the run ends."""

        def progress(attempt: int, at: float) -> list[dict]:
            return [
                {"time": at + s, "event": "progress", "attempt": attempt, "node": 0, "steps": {"0": s}}
                for s in range(steps)
            ]

        return [
            {"time": t0, "event": "start", "attempt": 0, "node": 0, "job": "storm"},
            *progress(0, t0 + 1),
            {"time": t0 + steps + 0.5, "event": "failure", "attempt": 0, "rank": 0},
            {"time": t0 + steps + 0.6, "event": "start", "attempt": 1, "node": 0},
            *progress(1, t0 + steps + 1),
            {"time": t0 + 2 * steps + 2, "event": "end", "node": 0, "exit_code": 143, "wall_s": 1.0},
        ]

    first, second = run(1000.0, 5), run(1100.0, 5)
    assert timeline_model.build(first + second).t0 == 1100.0  # unjoined: the last run alone
    one = joined(first + second, [1099.0])
    assert [e["event"] for e in one].count("end") == 1 and one[-1] is second[-1]
    assert {e["attempt"] for e in one if e["event"] == "start"} == {0, 1, 2, 3}
    restart = next(e for e in one if e["event"] == "restart")
    assert (restart["time"], restart["attempt"], restart["cause"]) == (1099.0, 2, WHOLE_JOB_RESTART)
    drawn = timeline_model.build(one)
    assert (drawn.t0, drawn.t1) == (1000.0, second[-1]["time"])
    assert timeline_costs.estimate(one, drawn.t1)["restarts"] == 3  # 1 + 1 in the runs, 1 by the harness


class Mlaunches:
    """Each host's mlaunch as a real process (``sleep``, or ``sh -c 'exit N'`` for one that ended with N): the
    storm loop's end condition reads only their exit codes, so no network namespace is needed here."""

    def __init__(self, hosts: int) -> None:
        import subprocess

        self.popen = subprocess.Popen
        self.hosts: list[None] = [None] * hosts
        self.procs: dict = {}
        self.in_job: set[int] = set()
        self.started: list[int] = []
        for index in range(hosts):
            self.start(index)

    def start(self, index: int) -> None:
        self.procs[index] = self.popen(["sleep", "60"])
        self.started.append(index)

    def ends(self, index: int, code: int) -> None:
        """Host ``index``'s mlaunch ended with ``code`` (the one before is stopped)."""
        self.procs[index].kill()
        self.procs[index].wait()
        self.procs[index] = self.popen(["sh", "-c", f"exit {code}"])
        self.procs[index].wait()

    def running(self, index: int) -> bool:
        return index in self.procs and self.procs[index].poll() is None

    def signal(self, index: int, sig: int) -> bool:
        self.procs[index].send_signal(sig)
        self.procs[index].wait()
        return True

    def wait_exit(self, index: int, timeout: float) -> int | None:
        self.procs[index].kill()
        return self.procs[index].wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait()


def storm_of(tmp_path: Path, hosts: Mlaunches) -> Storm:
    import random

    from benchmarks.chaos.inject import Injector

    injector = Injector(hosts, tmp_path, tmp_path, random.Random(1))  # type: ignore[arg-type]
    return Storm(hosts, injector, tmp_path, tmp_path / "end", [], 3.0)  # type: ignore[arg-type]


def test_node_0_lost_by_a_fault_is_no_end_of_the_run_and_the_survivors_end_it(tmp_path: Path) -> None:
    """Issue 45: node 0's mlaunch killed is a node loss (the hub moves, the job shrinks), not the job's end: its
    exit is expected, the harness starts nothing, and the run is over once the end step was written and the
    survivors' mlaunches ended with 0 — host 0 still out."""
    import time

    from benchmarks.chaos.schedule import Fault

    hosts = Mlaunches(3)
    storm = storm_of(tmp_path, hosts)
    try:
        hosts.in_job.update({0, 1, 2})
        storm.faults = [Fault(0, 1.0, "kill_mlaunch_node0", 0, 0.0, False)]
        storm.fire(storm.faults[0], time.monotonic())
        storm.check_exits()
        exit0 = storm.rec.exits[-1]
        assert (exit0["host"], exit0["code"], exit0["expected"]) == (0, -9, True)
        assert not storm.rec.unrecoverable and not storm.restart_due and hosts.started == [0, 1, 2]
        assert storm.rec.restarts == [] and not storm.over()  # no whole-job restart; the survivors train on
        storm.rec.end_written = time.monotonic()
        hosts.ends(1, 0)
        storm.check_exits()
        assert not storm.over()  # host 2 still runs
        hosts.ends(2, 0)
        storm.check_exits()
        assert storm.over() and not storm.rec.unrecoverable and hosts.started == [0, 1, 2]
    finally:
        hosts.stop()


def test_an_unasked_end_of_node_0_is_unrecoverable_and_it_starts_again_after_the_floor(tmp_path: Path) -> None:
    """Like a member's: node 0's mlaunch ending where no fault took it out is an unrecoverable error, and the
    harness starts it again as its platform would, but no sooner than the comeback floor (a node 0 back before the
    survivors moved the hub would host its own); after the end step was written, a non-zero end is unrecoverable
    too and nothing starts again."""
    import time

    from benchmarks.chaos.schedule import NODE0_COMEBACK_FLOOR

    hosts = Mlaunches(3)
    storm = storm_of(tmp_path, hosts)
    try:
        hosts.ends(0, 1)
        began = time.monotonic()
        storm.check_exits()
        assert [(u["host"], u["code"]) for u in storm.rec.unrecoverable] == [(0, 1)]
        assert storm.restart_due[0] >= began + NODE0_COMEBACK_FLOOR - 0.1 and hosts.started == [0, 1, 2]
        storm.restart_due[0] = time.monotonic()  # the floor has passed
        storm.check_exits()
        assert hosts.started == [0, 1, 2, 0] and hosts.running(0) and not storm.restart_due
        storm.rec.end_written = time.monotonic()
        hosts.ends(2, 1)
        for index in (0, 1):
            hosts.ends(index, 0)
        storm.check_exits()
        assert [(u["host"], u["code"]) for u in storm.rec.unrecoverable] == [(0, 1), (2, 1)]
        assert storm.over() and hosts.started == [0, 1, 2, 0]
    finally:
        hosts.stop()
