"""``hang_timeout: auto``'s decision (``launchers.observe.hang_limit``) as a pure function, and job.yaml's word for it.

The decision is tested on observed state alone; the real ranks that exercise it (a SIGSTOPped
rank, a run whose checkpoint and evaluation steps take 10 × a normal step) are in
``tests/test_hang_auto.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import clean_env, run_mlaunch

from launchers.observe.hang_limit import (
    FLOOR,
    K,
    Policy,
    Seen,
    StepTimes,
    Verdict,
    after_hang,
    auto_limit,
    hung_on_node,
    interval,
    judge,
    others_lost_after,
)

AUTO = Policy("auto", 1800.0)


def test_the_auto_limit_is_k_times_the_slowest_step_or_the_floor() -> None:
    assert auto_limit(None) == FLOOR
    assert auto_limit(0.1) == FLOOR  # a fast job: the floor
    assert auto_limit(20.0) == K * 20.0  # a slow one: K × its slowest step


def test_on_several_real_nodes_a_lost_node_is_told_before_any_rank_is_hung() -> None:
    """Ranks waiting for a node that died are silent too: node_timeout (the job shrinks) comes first."""
    several = Policy("auto", 1800.0, others_lost_after(30.0, several_real_nodes=True))
    assert not judge(Seen(reports=40, silent=FLOOR), several, slowest=0.1).hung
    assert judge(Seen(reports=40, silent=32.0), several, slowest=0.1) == Verdict(True, 32.0, "auto")
    assert others_lost_after(30.0, several_real_nodes=False) == 0.0  # one node, or a simulation


def test_a_silent_rank_is_hung_at_the_learned_limit_not_before() -> None:
    limit = K * 5.0
    assert not judge(Seen(reports=40, silent=limit - 0.01), AUTO, slowest=5.0).hung
    assert judge(Seen(reports=40, silent=limit), AUTO, slowest=5.0) == Verdict(True, limit, "auto")
    # ... whether its main thread is unknown (no stamp) or has run no Python since
    assert judge(Seen(reports=40, silent=limit, python_idle=limit), AUTO, slowest=5.0).hung


def test_a_silent_rank_that_still_runs_python_is_busy_until_the_start_timeout() -> None:
    seen = Seen(reports=40, silent=60.0, python_idle=0.2)  # an evaluation 12 × longer than any step seen
    verdict = judge(seen, AUTO, slowest=5.0)
    assert verdict == Verdict(False, 1800.0, "busy")
    assert judge(Seen(reports=40, silent=1800.0, python_idle=0.2), AUTO, slowest=5.0).hung  # a livelock, at last
    # not busy: it ran Python after its report, then blocked in a collective (a real run's waiters, at 10 s)
    assert judge(Seen(reports=40, silent=FLOOR, python_idle=FLOOR - 0.3), AUTO, slowest=0.3).hung
    assert judge(Seen(reports=40, silent=FLOOR, python_idle=0.6 * FLOOR - 0.01), AUTO, slowest=0.3).rule == "busy"
    # busy from half the limit on: rank 0 reported a little after the ranks now waiting for it in a barrier
    assert judge(Seen(reports=40, silent=K * 5.0 / 2, python_idle=0.2), AUTO, slowest=5.0).rule == "busy"
    assert judge(Seen(reports=40, silent=1.0, python_idle=0.2), AUTO, slowest=5.0).rule == "auto"  # stepping


def test_the_first_step_and_the_start_stay_under_the_start_timeout() -> None:
    assert judge(Seen(reports=0, silent=FLOOR * 10), AUTO, slowest=None) == Verdict(False, 1800.0, "start_timeout")
    assert judge(Seen(reports=1, silent=FLOOR * 10), AUTO, slowest=0.1) == Verdict(False, 1800.0, "first_step")
    assert judge(Seen(reports=1, silent=1800.0), AUTO, slowest=0.1).hung


def test_a_duration_overrides_the_learned_limit_and_the_busy_question() -> None:
    fixed = Policy(2.0, None)
    assert judge(Seen(reports=1, silent=2.0), fixed, slowest=100.0) == Verdict(True, 2.0, "hang_timeout")
    assert judge(Seen(reports=40, silent=2.0, python_idle=0.0), fixed, slowest=100.0).hung
    assert judge(Seen(reports=0, silent=1e6), fixed, slowest=None).limit is None  # no start_timeout: not judged
    off = Policy(None, 1800.0)
    assert judge(Seen(reports=40, silent=1e6), off, slowest=1.0).limit is None


def test_a_node_declares_nothing_while_one_of_its_silent_ranks_is_busy() -> None:
    """Ranks waiting in a barrier for rank 0's first long save run no Python; rank 0 does."""
    stuck, busy = Verdict(True, FLOOR, "auto"), Verdict(False, 1800.0, "busy")
    fine = Verdict(False, FLOOR, "auto")
    assert not hung_on_node([stuck, stuck, busy])
    assert hung_on_node([stuck, stuck, fine])
    assert not hung_on_node([fine, busy])
    assert hung_on_node([stuck, busy], stopped=True)  # a SIGSTOPped rank is not what the busy one waits for


def test_steps_are_learned_from_every_rank_without_the_first_interval() -> None:
    assert interval(None, (2, 10.0)) is None  # nothing read before
    assert interval((1, 0.0), (2, 60.0)) is None  # its first interval: compile, warm-up
    assert interval((2, 10.0), (2, 10.0)) is None  # nothing new
    assert interval((2, 10.0), (3, 10.5)) == 0.5
    times = StepTimes()
    for pid, reads in {1: [(1, 0.0), (2, 90.0), (3, 90.5), (4, 91.0)], 2: [(2, 0.0), (3, 2.0), (4, 2.5)]}.items():
        for count, mono in reads:
            times.learn(pid, count, mono)
    assert times.slowest == 2.0  # the slowest rank's step, not rank 1's 90 s first interval
    assert times.limit() == max(K * 2.0, FLOOR)
    times.new_attempt()  # a restart: pid 2 comes back as another process that has reported 9 times
    times.learn(2, 9, 500.0)
    assert times.slowest == 2.0  # not the 497.5 s across the restart


def test_a_step_judged_hung_twice_at_the_same_step_is_learned_and_other_hangs_teach_nothing() -> None:
    """A first long step in one C call is judged at the floor; after the restart it must not be judged again."""
    assert after_hang(None, 40, FLOOR) is None
    assert after_hang((40, FLOOR), 41, FLOOR) is None  # a real hang elsewhere
    times = StepTimes(slowest=0.5)
    times.hung(40, 10.2)
    assert times.limit() == FLOOR  # once: nothing learned (the chaos storm's hangs stay at the floor)
    times.hung(40, 10.3)
    assert times.slowest == 10.3 and times.limit() == K * 10.3  # twice at step 40: a 31 s step is allowed


@pytest.mark.parametrize(
    ("value", "ok"), [("auto", True), ("off", True), ("45s", True), ("null", True), ("autox", False), ("-3", False)]
)
def test_mlaunch_check_takes_auto_off_or_a_duration(tmp_path: Path, value: str, ok: bool) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"name: h\nengine: pytorch\nentry: train.py\nmonitor:\n  hang_timeout: {value}\n")
    result = run_mlaunch(["check", str(job)], env=clean_env())
    if ok:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 2, result.stderr
        assert "hang_timeout" in result.stderr and "line 5" in result.stderr, result.stderr
        assert "expected auto, off or a duration" in result.stderr or "negative" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
