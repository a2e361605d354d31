"""Which ranks cannot rejoin in place: stopped ones, and ones that *stay* in uninterruptible sleep.

After a failure mlaunch keeps the recoverable survivors and replaces the failed rank, plus any rank that
could not rejoin anyway: a stopped process (T) or one blocked in the kernel (D) on storage that does not
answer. A healthy rank passes through D for milliseconds whenever it writes its log on a loaded disk; one
sample of ``/proc/PID/stat`` would replace it for nothing (a CI run replaced two healthy ranks so).
What a user relies on:

- real processes: a running one is kept, a SIGSTOPped one is named stuck at once, one whose write blocks
  on a frozen filesystem (``fsfreeze``: root, skipped elsewhere) is named stuck after the window;
- a process that leaves D within the window is not stuck, and the wait ends when it leaves;
- the decision keeps the others, and names the stuck ones so mlaunch can say why they were replaced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from loop_storage import loop_mounted

from launchers.outcome import Failure
from launchers.procs import process_state
from launchers.run.in_place import keep_decision, stuck_pids


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        with_signal(child, signal.SIGCONT)
        child.kill()
        child.wait(30)


def with_signal(child: subprocess.Popen[bytes], sig: int) -> None:
    if child.poll() is None:
        os.kill(child.pid, sig)


def sleeper(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    children.append(child)
    return child


def test_a_stopped_process_is_stuck_at_once_and_a_sleeping_one_is_not(children: list[Any]) -> None:
    running, stopped = sleeper(children), sleeper(children)
    os.kill(stopped.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(stopped.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    waited: list[float] = []
    assert stuck_pids([running.pid, stopped.pid], sleep=waited.append) == {stopped.pid: "T"}
    assert waited == []  # no D seen: nothing to wait for


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[Path]:
    """A loop-mounted ext4 filesystem (``loop_storage``), frozen: writes block in the kernel, in D."""
    with loop_mounted(tmp_path, 16) as mount:
        subprocess.run(["fsfreeze", "--freeze", str(mount)], check=True)
        yield mount


def test_a_process_blocked_on_frozen_storage_is_stuck(children: list[Any], frozen: Path) -> None:
    # children first: its teardown (kill, wait) runs after the storage is thawed, when a blocked writer can die
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(frozen / 'x')!r}, 'w').write('x')"])
    children.append(writer)
    deadline = time.monotonic() + 20
    while process_state(writer.pid) != "D" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process_state(writer.pid) == "D"
    healthy = sleeper(children)
    started = time.monotonic()
    assert stuck_pids([writer.pid, healthy.pid], settle=0.2) == {writer.pid: "D"}
    assert time.monotonic() - started >= 0.2  # judged over the whole window, not from one look
    subprocess.run(["fsfreeze", "--unfreeze", str(frozen)], check=True)
    assert writer.wait(30) == 0  # it was only waiting for the storage


def test_a_process_that_leaves_uninterruptible_sleep_is_not_stuck() -> None:
    """The samples are given (a real transient D lasts too little to catch on demand): D twice, then S."""
    samples = {11: iter("DDS"), 12: iter("S")}
    waited: list[float] = []
    assert stuck_pids([11, 12], settle=10.0, state_of=lambda pid: next(samples[pid]), sleep=waited.append) == {}
    assert len(waited) == 2  # it looked until the process left D, not for the whole window


def worker(pid: int, required: bool = True) -> Any:
    return SimpleNamespace(pid=pid, label=f"rank {pid}", spec=SimpleNamespace(required=required))


def failure(pid: int, cause: str = "") -> Failure:
    return Failure(f"rank {pid}", pid, pid, 137, signal.SIGKILL, [], None, cause)


def test_after_a_kill_a_stuck_rank_is_replaced_with_the_failed_one_and_named() -> None:
    live = [worker(1), worker(3), worker(4)]
    decision = keep_decision(failure(2), live, declared={1, 3, 4}, stuck={3})
    assert [w.pid for w in decision.kept] == [1, 4]
    assert [w.pid for w in decision.stuck] == [3]
    assert decision.fallback is None


def test_after_a_hang_the_stuck_rank_is_the_culprit_whichever_rank_was_named() -> None:
    live = [worker(1), worker(2), worker(3)]
    decision = keep_decision(failure(1, "hung: made no progress for 3s"), live, declared={1, 2, 3}, stuck={3})
    assert [w.pid for w in decision.kept] == [1, 2]
    assert [w.pid for w in decision.stuck] == [3]


def test_with_nothing_stuck_every_survivor_stays() -> None:
    decision = keep_decision(failure(2), [worker(1), worker(3)], declared={1, 3}, stuck={})
    assert [w.pid for w in decision.kept] == [1, 3] and decision.stuck == []
