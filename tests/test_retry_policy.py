"""A failure that repeats itself exactly is not retried blindly (issue 30 item 3).

The decision is pure (``launchers.run.retry_policy``): tested on records. The end-to-end tests run
real mlaunch over a script that fails the same way every attempt — before its first step, or
at step 3 — and check that the restarts stop after the second attempt, saying why, and that
``restart.stop_on_repeat: false`` restarts as before.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import clean_env, run_mlaunch

from launchers.outcome import Failure
from launchers.run.left_behind import Told, cause
from launchers.run.retry_policy import (
    PROGRESS_UPTIME,
    made_progress,
    no_progress_streak,
    record_of,
    repeated,
    restart_delay,
    streak_after,
)

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/job/train.py", line 40, in <module>',
    "    main()",
    '  File "/job/train.py", line 12, in main',
    "    table = load(args.path)",
    "[rank1]: KeyError: 'vocab'",
]


def failure(tail: list[str], code: int = 1) -> Failure:
    return Failure("rank 1", 1, 99, code, None, tail, None)


def test_the_same_exception_before_the_first_step_twice_stops() -> None:
    first, second = record_of(failure(TRACEBACK), None), record_of(failure(TRACEBACK), None)
    assert first.where == "KeyError: 'vocab' at /job/train.py:12 in main"
    assert repeated(None, first) is None  # the first time it may be transient
    assert repeated(first, second) == (
        "the same failure before the first step in two attempts in a row: KeyError: 'vocab' at /job/train.py:12 in main"
    )


def test_the_same_exception_at_the_same_step_stops_and_elsewhere_does_not() -> None:
    at_17 = record_of(failure(TRACEBACK), 17)
    assert repeated(at_17, record_of(failure(TRACEBACK), 17)) is not None
    assert repeated(at_17, record_of(failure(TRACEBACK), 18)) is None  # it got further: retry
    assert repeated(at_17, record_of(failure([*TRACEBACK[:-1], "ValueError: other"]), 17)) is None
    other_line = [*TRACEBACK[:3], '  File "/job/train.py", line 13, in main', *TRACEBACK[4:]]
    assert repeated(at_17, record_of(failure(other_line), 17)) is None  # another place


def test_a_kill_without_a_traceback_is_retried_even_at_the_same_step() -> None:
    killed = record_of(failure(["step 5 loss 0.1"], code=137), 5)
    assert not killed.traceback
    assert repeated(killed, record_of(failure(["step 5 loss 0.1"], code=137), 5)) is None
    assert repeated(record_of(failure([], 137), None), record_of(failure([], 137), None)) is None  # before a step too


SCRIPT = """\
import os
from launchers import elastic
for step in range(10):
    elastic.heartbeat(step)
    if step == {at}:
        raise KeyError("vocab")
"""


def job(tmp: Path, at: int, extra: str = "") -> Path:
    script = tmp / "train.py"
    script.write_text(SCRIPT.format(at=at) if at >= 0 else 'raise KeyError("vocab")\n')
    path = tmp / "job.yaml"
    path.write_text(
        f"entry: {script}\nengine: pytorch\nnodes: 1\nprocs_per_node: 2\nlog_dir: {tmp / 'logs'}\n"
        f"restart: {{max_restarts: 3, backoff: 0s{extra}}}\n"
    )
    return path


@pytest.mark.parametrize(("at", "said"), [(-1, "before the first step"), (3, "at step 3")])
def test_a_deterministic_error_stops_the_restarts_after_the_second_attempt(tmp_path: Path, at: int, said: str) -> None:
    result = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, at))], env=clean_env())
    err = result.stderr
    assert result.returncode == 1, err
    assert f"not restarting: the same failure {said} in two attempts in a row: KeyError: 'vocab' at " in err, err
    assert err.count("restarting the group (") == 1, err  # one restart, not three


def test_stop_on_repeat_false_restarts_as_before(tmp_path: Path) -> None:
    result = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, -1, ", stop_on_repeat: false"))], env=clean_env())
    assert result.returncode == 1 and result.stderr.count("restarting the group (") == 3, result.stderr
    assert "giving up after 3 restart(s)" in result.stderr


def test_the_backoff_guards_a_crash_loop_not_a_fault() -> None:
    """Issue 44 item 5: no wait after a failure that followed progress; doubling for failures in a row without."""
    assert made_progress(first_step=7, ran_for=0.5)  # a step trained: a fault, not a crash loop
    assert not made_progress(first_step=None, ran_for=2.0)  # died before any step
    assert made_progress(first_step=None, ran_for=PROGRESS_UPTIME)  # a script that reports no steps, ran a while
    streak = 0
    waits = []
    for progressed in (True, False, False, False, True, False):
        streak = no_progress_streak(streak, progressed)
        waits.append(restart_delay(1.0, 5.0, streak))
    assert waits == [0.0, 1.0, 2.0, 4.0, 0.0, 1.0]  # progress resets the streak
    assert restart_delay(1.0, 5.0, 10) == 5.0  # capped by max_backoff


def test_a_survivor_replaced_for_being_left_behind_adds_no_backoff() -> None:
    """mlaunch's kill of a survivor left behind in an in-place recovery (``run.left_behind``) finishes the recovery
    of the fault before it: the attempt it ends had no time to train, and is no crash loop. The streak stays
    what that fault left: no backoff after a fault that followed progress (it was 1 s before), the backoff
    kept within a crash loop; any other failure of an attempt without a step counts as before."""
    replaced = cause(Told(at=0.0, attempt=15, held_in=14))
    assert streak_after(0, progressed=False, first_cause=replaced) == 0
    assert restart_delay(1.0, 5.0, streak_after(0, progressed=False, first_cause=replaced)) == 0.0
    assert streak_after(2, progressed=False, first_cause=replaced) == 2  # inside a crash loop: it stays one
    assert streak_after(0, progressed=False, first_cause="") == 1  # a crash before any step, as before
    assert streak_after(0, progressed=False, first_cause="hung: no progress for 5m") == 1
    assert streak_after(3, progressed=True, first_cause="") == 0


KILLED_AFTER_PROGRESS = """\
import os, signal
from launchers import elastic
attempt = int(os.environ["MLAUNCH_RESTART_COUNT"])
for step in range(6):
    elastic.heartbeat(step)
    if step == 3 and attempt < 2 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_default_policy_restarts_a_fault_after_progress_at_once(tmp_path: Path) -> None:
    """job.yaml's defaults (no ``backoff:``): two kill -9s after steps were trained restart without waiting."""
    script = tmp_path / "train.py"
    script.write_text(KILLED_AFTER_PROGRESS)
    path = tmp_path / "job.yaml"
    path.write_text(
        f"entry: {script}\nengine: pytorch\nnodes: 1\nprocs_per_node: 2\nlog_dir: {tmp_path / 'logs'}\n"
        "restart: {max_restarts: 3}\n"
    )
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    assert result.returncode == 0, result.stderr
    assert len(re.findall(r"in 0s[^(\n]*\(the attempt trained before it failed: no backoff\)", result.stderr)) == 2


def test_default_policy_backs_off_a_crash_loop(tmp_path: Path) -> None:
    """Failures in a row before any step wait restart.backoff (default 1 s), then twice as long."""
    result = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, -1, ", stop_on_repeat: false"))], env=clean_env())
    err = result.stderr
    assert "restarting the group (1/3) in 0s" in err, err  # the job's backoff is 0s here: still no wait
    path = tmp_path / "job.yaml"
    path.write_text(path.read_text().replace("backoff: 0s, ", "max_restarts: 2, ").replace("{max_restarts: 3, ", "{"))
    err = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env()).stderr
    assert "restarting the group (1/2) in 1s" in err, err
    assert re.search(r"restarting the group \(2/2\) in 2s[^(\n]*\(2 failures in a row", err), err
