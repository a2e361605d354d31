"""``run.left_behind``: which survivor told ``go`` is replaced at once, and which is waited for.

The rule, pure (``verdict``, ``look``), and the one fact it reads from the system (``main_thread``: a real
process's main thread, asleep or computing). The end-to-end cases (a survivor asleep in its call is
replaced after 1 s; one computing through the fault keeps its process) are in ``tests/test_in_place.py``
and, on two netns hosts, ``tests/test_in_place_hosts.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launchers.elastic.ipc import recovery
from launchers.elastic.ranks.env import ATTEMPT_ENV, RUN_ID_ENV, SHM_DIR_ENV
from launchers.run.left_behind import ASLEEP_WITHIN, BUSY_TICKS, LEAVE_WITHIN, Told, look, sample, verdict


def test_a_survivor_asleep_in_its_call_is_replaced_after_asleep_within() -> None:
    told = Told(at=100.0, attempt=3, held_in=2)
    look(told, 100.1, ("S", 50))
    look(told, 100.5, ("S", 50))
    assert verdict(told, 100.5, left_call=False) is None
    look(told, 100.0 + ASLEEP_WITHIN, ("S", 50))
    why = verdict(told, 100.0 + ASLEEP_WITHIN, left_call=False)
    assert why is not None and "did not leave attempt 2's call within 1s of its go" in why


def test_a_survivor_that_computes_is_waited_for_until_leave_within() -> None:
    told = Told(at=100.0, attempt=3, held_in=2)
    for i, now in enumerate((100.2, 100.9, 101.6, 102.3, 103.0, 103.9, 104.8, 105.7, 106.6, 107.5, 107.9)):
        look(told, now, ("S", 50 + BUSY_TICKS * i))  # its CPU time grows: computing its way to the next collective
        assert verdict(told, now, left_call=False) is None, now
    look(told, 108.0, ("S", 60))
    why = verdict(told, 100.0 + LEAVE_WITHIN, left_call=False)
    assert why is not None and "did not take its place in attempt 3 within 8s" in why


def test_the_trickle_of_cpu_its_background_threads_use_asleep_is_not_running() -> None:
    """Asleep in a collective, a survivor's watcher and gloo's event loops still wake: under a tick a second."""
    told = Told(at=100.0, attempt=3, held_in=2)
    look(told, 100.0, ("S", 50))
    for i, now in enumerate((100.25, 100.5, 100.75), start=1):
        look(told, now, ("S", 50 + i))
        assert verdict(told, now, left_call=False) is None
    look(told, 100.0 + ASLEEP_WITHIN, ("S", 50 + BUSY_TICKS - 1))
    assert verdict(told, 100.0 + ASLEEP_WITHIN, left_call=False) is not None


def test_a_runnable_main_thread_counts_as_running_without_a_tick() -> None:
    """Under load a thread woken from its wait may wait for a core: runnable (R) is not asleep."""
    told = Told(at=100.0, attempt=1, held_in=0)
    for now in (100.3, 100.8, 101.3, 101.8):
        look(told, now, ("R", 50))
        assert verdict(told, now, left_call=False) is None


def test_a_survivor_that_left_its_call_may_sleep_until_leave_within() -> None:
    """Out of its call it may wait for rank 0's new store (up to 5 s), asleep: that is not being left behind."""
    told = Told(at=100.0, attempt=1, held_in=0)
    look(told, 100.1, ("S", 5))
    look(told, 104.0, ("S", 5))
    assert verdict(told, 104.0, left_call=True) is None
    assert verdict(told, 100.0 + LEAVE_WITHIN, left_call=True) is not None


def test_an_unreadable_main_thread_changes_nothing() -> None:
    told = Told(at=100.0, attempt=1, held_in=0)
    look(told, 100.5, None)
    assert told.ticks is None and told.awake_at == 100.0


def test_sample_reads_a_sleeping_and_a_computing_process() -> None:
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        first_asleep, first_busy = sample(asleep.pid), sample(busy.pid)
        time.sleep(0.5)
        then_asleep, then_busy = sample(asleep.pid), sample(busy.pid)
        assert first_asleep is not None and then_asleep is not None and first_busy is not None and then_busy
        assert then_asleep[0] == "S" and then_asleep[1] == first_asleep[1]  # no CPU time while asleep
        assert then_busy[1] - first_busy[1] >= BUSY_TICKS  # its CPU time grows: 0.5 s of a core is 50 ticks
    finally:
        for proc in (asleep, busy):
            proc.kill()
            proc.wait()
    assert sample(asleep.pid) is None  # reaped: unreadable


def test_a_rank_marks_the_attempt_whose_call_it_left_and_withdraws_the_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank writes its own file (never mlaunch's, which could hold a ``go``); mlaunch reads the attempt."""
    monkeypatch.setenv(SHM_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RUN_ID_ENV, "run-left")
    monkeypatch.setenv(ATTEMPT_ENV, "4")
    pid = os.getpid()
    assert recovery.marks_of("run-left", pid)[1] == -1  # left nothing yet
    assert recovery.declare()
    recovery.go("run-left", pid, 5, {ATTEMPT_ENV: "5"})
    recovery.mark_left()
    assert recovery.marks_of("run-left", pid)[1] == 4
    word = recovery.read(recovery.path_of("run-left", pid))
    assert word is not None and word.state == recovery.GO and word.attempt == 5  # mlaunch's word untouched
    assert recovery.declared_pids("run-left") == {pid}  # the mark is no declaration
    assert recovery.marks_of("run-left", pid)[0] == -1  # it has not taken the go yet
    recovery.withdraw()
    assert recovery.marks_of("run-left", pid)[1] == -1 and recovery.declared_pids("run-left") == set()


def test_a_rank_that_joins_says_so_in_its_own_file_and_never_writes_over_mlaunchs_newer_word(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a rank's re-declaration had: it took ``go`` 5, mlaunch wrote ``go`` 6 (attempt 5 failed meanwhile)
    before the rank said it joined. The rank's words go into its own file; mlaunch's ``go`` 6 stays, and
    mlaunch reads that the rank joined 5 (not 6: it is still told to move on). A second ``declare`` in the same
    process (a wrapped function called again) does not rewrite mlaunch's file either."""
    monkeypatch.setenv(SHM_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RUN_ID_ENV, "run-joined")
    monkeypatch.setenv(ATTEMPT_ENV, "4")
    pid = os.getpid()
    assert recovery.declare()
    recovery.go("run-joined", pid, 5, {ATTEMPT_ENV: "5"})
    monkeypatch.setenv(ATTEMPT_ENV, "5")  # the rank applied the go's environment
    recovery.mark_left()
    recovery.go("run-joined", pid, 6, {ATTEMPT_ENV: "6"})  # mlaunch, at the same moment
    recovery.mark_joined()
    assert recovery.declare()
    word = recovery.read(recovery.path_of("run-joined", pid))
    assert word is not None and word.state == recovery.GO and word.attempt == 6, word
    assert recovery.marks_of("run-joined", pid)[0] == 5 and recovery.marks_of("run-joined", pid)[1] == 5
    recovery.withdraw()
    assert recovery.marks_of("run-joined", pid)[0] == -1 and not list(tmp_path.iterdir())


def test_a_dead_processs_file_of_the_same_pid_is_replaced_at_the_first_declaration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed rank's file stays until the run ends; a new process given its pid declares afresh: mlaunch's old
    word and the dead process's marks go (a later call in the same process then only marks that it joined)."""
    monkeypatch.setenv(SHM_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RUN_ID_ENV, "run-reused")
    monkeypatch.setenv(ATTEMPT_ENV, "7")
    pid = os.getpid()
    path = recovery.path_of("run-reused", pid)
    Path(path).write_text('{"state": "go", "attempt": 3, "env": {}}')  # the dead process's
    Path(recovery.marks_path(path)).write_text("3 3")
    assert recovery.declare()
    word = recovery.read(path)
    assert word is not None and word.state == recovery.DECLARED and word.attempt == 7, word
    assert recovery.marks_of("run-reused", pid)[0] == -1 and recovery.marks_of("run-reused", pid)[1] == -1
    recovery.withdraw()


def _joining_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, port: int) -> None:
    """A survivor's environment as mlaunch's ``go`` sets it (every key restored after the test)."""
    for name, value in {
        SHM_DIR_ENV: str(tmp_path), RUN_ID_ENV: "run-superseded", ATTEMPT_ENV: "0", "RANK": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("next_word", ["go", "hold, then go"])
def test_a_survivor_whose_attempt_is_superseded_while_it_waits_for_rank_0_joins_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, next_word: str
) -> None:
    """A survivor joining attempt 1 waits (up to 5 s) for rank 0's new store; rank 0 fails before it listens and
    mlaunch holds attempt 1, then says ``go`` to attempt 2. Seen on two hosts when mlaunch replaced a rank 0
    left behind: the survivors finished their wait, declared themselves over mlaunch's newer ``go`` and waited
    in ``init_process_group`` for a store that never came, until ``monitor.rejoin_timeout`` restarted every
    rank. Now the wait ends as the word comes, the newer word is returned to be joined, and mlaunch's file
    still holds it. Real files and a real refused port (nothing listens)."""
    from launchers.elastic import in_place

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _joining_env(monkeypatch, tmp_path, port)
    pid = os.getpid()
    assert recovery.declare()
    recovery.go("run-superseded", pid, 1, {ATTEMPT_ENV: "1"})
    joining = recovery.read(recovery.path_of("run-superseded", pid))
    assert joining is not None

    def mlaunch() -> None:
        time.sleep(0.3)
        if next_word != "go":
            recovery.hold("run-superseded", pid, 1, "rank 0 failed")
            time.sleep(0.3)
        recovery.go("run-superseded", pid, 2, {ATTEMPT_ENV: "2", "MASTER_PORT": str(port)})

    speaker = threading.Thread(target=mlaunch)
    started = time.monotonic()
    speaker.start()
    newer = in_place._rejoin(joining)
    speaker.join()
    assert newer is not None and newer.state == recovery.GO and newer.attempt == 2, newer
    assert time.monotonic() - started < in_place.STORE_WAIT_SECONDS - 2  # not the whole wait for rank 0
    kept = recovery.read(recovery.path_of("run-superseded", pid))
    assert kept is not None and kept.state == recovery.GO and kept.attempt == 2  # not written over
    recovery.withdraw()
