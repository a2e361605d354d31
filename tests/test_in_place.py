"""In-place recovery (issue 44): ``@elastic.recoverable`` keeps the surviving ranks' processes through a fault.

Real mlaunch, real ranks (1 node × 4, DDP over gloo, CPU), real faults: rank 2 kills itself with
SIGKILL, or stops itself with SIGSTOP (a hang: mlaunch judges it after ``monitor.hang_timeout``).
What a user relies on, checked from what each rank recorded (``tests/scripts/in_place_ddp.py``
writes which process trained which step):

- the survivors keep their processes (the same pid before and after the fault) and only the failed
  rank's pid changes;
- no step is lost: the re-formed group resumes right after the newest step every rank staged;
- the training ends exactly as the same fault ends it without the decorator (the whole job
  restarted), and exactly as the fault-free run when DDP's buckets are restored (issue 48);
- every rank of the re-formed group reads the step from the memory the recovery kept
  (``ipc.kept_segments``), not from the checkpoint directory, and nothing kept outlives the run;
- mlaunch says what it did (log, ``events.jsonl``), and a failure that is the rank's own is still
  raised.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch

pytestmark = needs_torch

SCRIPT = ROOT / "tests" / "scripts" / "in_place_ddp.py"


def job(tmp: Path, fault: str, *, off: bool = False, extra: str = "", at: int = 15) -> Path:
    log = tmp / "steps"
    log.mkdir(parents=True, exist_ok=True)
    env = f"IN_PLACE_LOG: {log}" + (', IN_PLACE_OFF: "1"' if off else "")
    path = tmp / "job.yaml"
    path.write_text(
        f"name: in-place\nentry: {SCRIPT}\nargs: [--fault, {fault}, --steps, '30', --at, '{at}']\nengine: pytorch\n"
        f"nodes: 1\nprocs_per_node: 4\nlog_dir: {tmp / 'logs'}\nenv: {{{env}}}\n"
        f"checkpoint: {{dir: {tmp / 'ckpt'}}}\nrestart: {{max_restarts: 3}}\npreload: [torch]\n{extra}"
    )
    return path


def pids_per_rank(tmp: Path) -> dict[int, list[int]]:
    """Each rank's processes, in the order they trained (one pid: the process was never replaced)."""
    found: dict[int, list[int]] = {}
    for path in sorted((tmp / "steps").glob("rank*")):
        pids: list[int] = []
        for line in path.read_text().splitlines():
            pid = int(line.split()[0])
            if not pids or pids[-1] != pid:
                pids.append(pid)
        found[int(path.name[4:])] = pids
    return found


def steps_trained(tmp: Path, rank: int) -> list[int]:
    return [int(line.split()[1]) for line in (tmp / "steps" / f"rank{rank}").read_text().splitlines()]


def final(stdout: str) -> str:
    match = re.search(r"final-checksum (\w+)", stdout)
    assert match, stdout[-2000:]
    return match.group(1)


def events(tmp: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp / "logs" / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def whole_restart(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final checksum of the same kill -9 without the decorator: every rank restarted."""
    tmp = tmp_path_factory.mktemp("whole")
    result = run_mlaunch(["--engine", "pytorch", str(job(tmp, "kill", off=True))], env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert {len(p) for p in pids_per_rank(tmp).values()} == {2}  # every rank was a new process
    return final(result.stdout)


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_survivors_keep_their_processes_and_lose_nothing(tmp_path: Path, fault: str, whole_restart: str) -> None:
    extra = "monitor: {hang_timeout: 3s}\n" if fault == "hang" else ""
    shm = tmp_path / "shm"  # this run's shared memory alone: what it leaves there is its own
    shm.mkdir()
    env = {**clean_env(), "MLAUNCH_SHM_DIR": str(shm)}
    result = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, fault, extra=extra))], env=env)
    err = result.stderr
    assert result.returncode == 0, err[-3000:]
    # every rank of the re-formed group, the replacement too, read step 14 from the memory the recovery kept
    assert re.findall(r"step (\d+) read from the memory the in-place recovery kept", err) == ["14"] * 4, err
    assert not list(shm.iterdir()), list(shm.iterdir())  # nothing kept outlives the run
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [1, 1, 2, 1], (pids, err[-2000:])  # only rank 2 is a new process
    assert "rank 0, rank 1, rank 3 keep their processes and rejoin in place" in err, err
    for rank in (0, 1, 3):
        trained = steps_trained(tmp_path, rank)
        assert sorted(set(trained)) == list(range(30)), trained  # every step, none skipped
    victim = steps_trained(tmp_path, 2)
    assert victim[:15] == list(range(15)) and victim[15:] == list(range(victim[15], 30)), victim
    assert victim[15] == 15, f"the re-formed group resumed at {victim[15]}, not after the last staged step 14"
    assert final(result.stdout) == whole_restart  # the same training as a whole-job restart
    kinds = [e["event"] for e in events(tmp_path)]
    assert "kept_in_place" in kinds and "rejoined_in_place" in kinds, kinds


def test_an_orphan_the_failed_rank_left_is_killed_while_the_survivors_train_on(tmp_path: Path) -> None:
    """The victim leaves a ``sleep`` in a session of its own (no group signal reaches it); mlaunch, its subreaper,
    kills and reaps it once the survivors were told to rejoin, during the run, not at the run's end."""
    path = job(tmp_path, "kill", at=10).read_text().replace("'30'", "'400'")
    (tmp_path / "job.yaml").write_text(path)
    env = {**clean_env(), "IN_PLACE_ORPHAN": "1"}
    argv = [*mlaunch_cmd(), "--engine", "pytorch", str(tmp_path / "job.yaml")]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid_file, gone_while_running = tmp_path / "steps" / "orphan", False
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if pid_file.exists() and pid_file.read_text() and not Path(f"/proc/{pid_file.read_text()}").exists():
                gone_while_running = max(steps_trained(tmp_path, 0)) < 390  # the survivors still had steps to go
                break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert pid_file.exists(), err[-3000:]
    assert gone_while_running, f"orphan {pid_file.read_text()} outlived the recovery (the training ended first)"
    assert [len(p) for p in pids_per_rank(tmp_path).values()] == [1, 1, 2, 1]  # it recovered in place


def test_the_rejoin_bound_follows_the_runs_own_start() -> None:
    """``monitor.rejoin_timeout``: auto is twice the longest start-to-first-reports, never under 30 s, and nothing
    until the ranks were seen to report; a duration is itself; off is no bound."""
    from launchers.run.rejoin import rejoin_limit

    assert rejoin_limit("auto", None) is None
    assert rejoin_limit("auto", 4.0) == 30.0
    assert rejoin_limit("auto", 50.0) == 100.0
    assert rejoin_limit(3.0, None) == 3.0
    assert rejoin_limit(None, 50.0) is None


def test_a_fault_soon_after_the_first_steps_still_teaches_the_bound() -> None:
    """The watch looks at the progress files once a second; a fault soon after the first steps came before any
    look saw every rank report (under CI load): nothing was learned, so ``auto`` never judged the next group
    re-formed in place (one stuck in gloo's full mesh waited for good). At the failure, the reports are read
    once more: the bound is learned from the first steps' own times, not from the fault's (a fault an hour in
    does not teach an hour)."""
    from launchers.elastic.ipc.progress import Progress
    from launchers.run.rejoin import RejoinWatch, rejoin_limit

    def report(pid: int, attempt: int, first_after: float, count: int = 15) -> Progress:
        first = watch.started_wall + first_after if count else 0.0
        return Progress("", pid, pid, attempt, 0, 14, count, 0.0, first + 0.5, 0 if count else -1, first)

    watch = RejoinWatch(f"settle-early-{uuid.uuid4().hex}", 0, "auto")
    late = [report(1, 0, 4.0), report(2, 0, 4.3), report(3, 0, 0.0, count=0)]  # rank 3: no step yet
    watch.settle(late, {1, 2, 3})
    assert watch.learned.longest is None and not watch.done  # not every rank reported: nothing to learn
    watch = RejoinWatch(f"settle-{uuid.uuid4().hex}", 1, "auto")
    stale = report(4, 0, 9.0)  # an earlier attempt's file: not this attempt's start
    watch.settle([report(1, 1, 4.0), report(2, 1, 4.3), stale], {1, 2})
    assert watch.learned.longest == pytest.approx(4.3, abs=0.01) and watch.done
    assert rejoin_limit("auto", watch.learned.longest) == 30.0
    watch.settle([report(1, 1, 60.0), report(2, 1, 61.0)], {1, 2})  # once learned, an attempt is done
    assert watch.learned.longest == pytest.approx(4.3, abs=0.01)


def test_a_recovery_that_never_completes_falls_back_to_a_whole_restart(tmp_path: Path, whole_restart: str) -> None:
    """Rank 2 is killed; survivor rank 1, called again, blocks before it rejoins (``IN_PLACE_STALL``): the group
    never forms and nothing fails. Within ``monitor.rejoin_timeout`` mlaunch says so, every rank writes its stacks,
    and the whole job restarts from the step the flash save committed: nothing lost, the same training."""
    path = job(tmp_path, "kill", extra="monitor: {rejoin_timeout: 3s}\n")
    path.write_text(path.read_text().replace("env: {", "env: {IN_PLACE_STALL: '1', "))
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    err = result.stderr
    assert result.returncode == 0, err[-3000:]
    assert "the in-place recovery did not complete within 3s (monitor.rejoin_timeout): rank " in err, err
    assert re.search(r"rank 1 is outside any collective wait; innermost frame: in_place_ddp.py:\d+ in stall_once", err)
    assert "rank 1 (pid " in err and "did not rejoin within 3s after an in-place recovery" in err, err
    assert "cannot recover in place: the last in-place recovery did not complete" in err, err
    assert "stall_once" in (tmp_path / "logs" / "rank1.log").read_text()  # its stacks say where it was
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [2, 2, 2, 2], pids  # every rank restarted after the stall
    for rank in range(4):
        trained = steps_trained(tmp_path, rank)
        assert sorted(set(trained)) == list(range(30)), trained  # nothing lost, nothing skipped
    assert final(result.stdout) == whole_restart
    fallbacks = [e for e in events(tmp_path) if e["event"] == "in_place_fallback"]
    assert fallbacks and "rejoin_timeout" in str(fallbacks[0]["reason"]), fallbacks


def test_a_survivor_that_never_takes_its_go_is_replaced_within_seconds(tmp_path: Path, whole_restart: str) -> None:
    """Rank 2 is killed at step 2 while survivor rank 1 sleeps there (``IN_PLACE_DEAF``): a wait its watcher's
    shut-down connections cannot end, as gloo's send to a peer that closed first does (``run.left_behind``; it
    cannot be caused at will, so a sleep stands in for it). mlaunch kills rank 1 once it has slept, still in its
    call, for ``ASLEEP_WITHIN`` (1 s) after its ``go``, instead of holding the new group until
    ``monitor.rejoin_timeout``. Ranks 0 and 3 were cut off while forming the new group: they re-form in place
    once more, with both replacements (a survivor cut off inside ``init_process_group`` named its next group as
    a fresh process does: ``_reset_group_names``), and nothing is lost.

    Step 2 is early on purpose: the fault comes before the rejoin watch's once-a-second look saw every rank
    report, which once left ``auto`` unarmed (``RejoinWatch.settle``)."""
    path = job(tmp_path, "kill", at=2)
    text = path.read_text().replace("env: {", "env: {IN_PLACE_DEAF: '1', ")
    path.write_text(text.replace("max_restarts: 3", "max_restarts: 5"))  # two restarts by design, room for more
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    err = result.stderr
    assert result.returncode == 0, err[-6000:]
    said = r"rank 1 did not leave attempt 0's call within 1s of its go, asleep throughout .*SIGKILL, it is rep"
    assert re.search(said, err), err[-3000:]
    assert re.search(r"rank 1 failed: rank \d, rank \d, rank \d keep their processes", err), err[-3000:]
    assert re.search(r"job failed: rank 1 \(pid \d+\) was left behind in attempt 0's call and was replaced", err)
    assert "restarting the group (2/5) in 0s" in err, err[-3000:]  # finishing a recovery, not a crash: no backoff
    assert "cannot recover in place" not in err and "monitor.rejoin_timeout" not in err, err[-3000:]
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [1, 2, 2, 1], (pids, err[-3000:])  # 0 and 3 kept throughout
    for rank in range(4):
        assert sorted(set(steps_trained(tmp_path, rank))) == list(range(30)), rank  # nothing lost, nothing skipped
    assert final(result.stdout) == whole_restart


def test_a_survivor_computing_through_the_fault_is_waited_for_not_replaced(tmp_path: Path, whole_restart: str) -> None:
    """Rank 2 is killed at step 2 while survivor rank 1 computes there for 3 s (``IN_PLACE_BUSY``: a long step's
    compute, its main thread running): it is not left behind, only late. It meets its next collective, which
    fails at once (its connections are shut down), leaves its call and rejoins in place: every survivor keeps
    its process. The rule that replaces a survivor after 1 s (``run.left_behind``) is for one asleep in its
    call, never for one at work."""
    path = job(tmp_path, "kill", at=2)
    path.write_text(path.read_text().replace("env: {", "env: {IN_PLACE_BUSY: '1', IN_PLACE_BUSY_S: '3', "))
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    err = result.stderr
    assert result.returncode == 0, err[-6000:]
    assert (tmp_path / "steps" / "busy-done").exists()
    assert "SIGKILL, it is replaced" not in err and "cannot recover in place" not in err, err[-3000:]
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [1, 1, 2, 1], (pids, err[-3000:])  # only the killed rank is new
    for rank in range(4):
        assert sorted(set(steps_trained(tmp_path, rank))) == list(range(30)), rank
    assert final(result.stdout) == whole_restart


@pytest.mark.slow
def test_survivors_waiting_for_a_rank_0_replaced_after_8s_keep_their_processes(
    tmp_path: Path, whole_restart: str
) -> None:
    """Rank 2 is killed at step 2 while rank 0, the next group's store host, computes there for 12 s
    (``IN_PLACE_BUSY``: running, so not taken for asleep; in its call past ``LEAVE_WITHIN``, 8 s, so replaced
    then). Ranks 1 and 3 took their ``go`` at once and wait for rank 0's new store. They must wait until mlaunch
    supersedes the attempt, then join the next: on two hosts they gave up after 5 s, waited in
    ``init_process_group``'s store connect, which nothing ends, and were replaced as well (every rank new)."""
    path = job(tmp_path, "kill", at=2)
    path.write_text(path.read_text().replace("env: {", "env: {IN_PLACE_BUSY: '0', IN_PLACE_BUSY_S: '12', "))
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    err = result.stderr
    assert result.returncode == 0, err[-6000:]
    assert re.search(r"rank 0 did not take its place in attempt 1 within 8s .*SIGKILL, it is replaced", err), err
    assert re.search(r"attempt 1 was superseded while this process joined it: joining the next", err), err[-3000:]
    assert "cannot recover in place" not in err and "monitor.rejoin_timeout" not in err, err[-3000:]
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [2, 1, 2, 1], (pids, err[-3000:])  # ranks 1 and 3 kept throughout
    for rank in range(4):
        assert sorted(set(steps_trained(tmp_path, rank))) == list(range(30)), rank
    assert final(result.stdout) == whole_restart


def test_survivors_asleep_waiting_for_a_cold_rank_0_are_not_left_behind(tmp_path: Path) -> None:
    """Rank 0 is killed and no standby is kept (no ``preload:``, no learning): its replacement starts cold
    (an interpreter, torch's import) while the survivors, out of their failed call, wait asleep for its new
    store (1.4 s on 2 cores). The rule that replaces a survivor asleep in its call after 1 s
    (``run.left_behind``) must not take them for left behind: they marked that they left their call
    (``recovery.mark_left``), and their wait for the store polls (its CPU ticks alone would also keep them).
    Every survivor keeps its process."""
    path = job(tmp_path, "kill", at=4)
    text = path.read_text().replace("--fault, kill,", "--fault, kill, --victim, '0',")
    path.write_text(text.replace("preload: [torch]", "preload: []\npreload_learning: false"))
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    err = result.stderr
    assert result.returncode == 0, err[-6000:]
    assert "rank 1, rank 2, rank 3 keep their processes and rejoin in place" in err, err[-3000:]
    assert "SIGKILL, it is replaced" not in err and "cannot recover in place" not in err, err[-3000:]
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [2, 1, 1, 1], (pids, err[-3000:])
    for rank in range(4):
        assert sorted(set(steps_trained(tmp_path, rank))) == list(range(30)), rank


def test_a_ranks_own_error_is_raised_not_recovered(tmp_path: Path) -> None:
    """An exception no peer failure explains is the rank's own: it fails the job as before (no restart here)."""
    script = tmp_path / "own.py"
    script.write_text(
        "from launchers import elastic\n\n@elastic.recoverable\ndef train():\n"
        "    elastic.heartbeat(0)\n    raise KeyError('vocab')\n\ntrain()\n"
    )
    path = tmp_path / "job.yaml"
    path.write_text(f"entry: {script}\nengine: pytorch\nnodes: 1\nprocs_per_node: 2\nlog_dir: {tmp_path / 'logs'}\n")
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    assert result.returncode == 1, result.stderr
    assert "KeyError: 'vocab'" in result.stderr
    assert "rejoin in place" not in result.stderr
