"""Membership changes keep the work, across real hosts (issue 34): 3 network-namespace hosts × 2 ranks.

A DDP job written the way docs/graceful-exit.md shows (``tests/scripts/plain_ddp.py``:
``state = ckpt.load_latest()``, ``stage`` every step, ``save`` every 5), ``pytorch.nnodes: "2:3"``,
one mlaunch per host the ModelArts way, real gloo across the hosts' ``eth0``:

- host 3's link goes down: the job shrinks to 4 ranks and resumes from the newest committed step
  (written by 6 ranks: the state is replicated, so the plain API loads it), the model equal to the
  saved one; host 3 comes back and is admitted after the next commit (``elastic.grow:
  at_checkpoint``): 6 ranks resume from that 4-rank commit. The same with ``load_latest(into=)``.
  Before issue 34 the plain API trained from step 0 after the shrink, kept the 6-rank job's commits
  over its own, and after the grow resumed from step 24 again.
- a member preempted (SIGTERM to its mlaunch) while a restarted node waits as a candidate: the job
  re-forms with the candidate and finishes with exit 0 on the nodes that stayed, from the step the
  graceful stop saved. Before, node 0 waited for the leaving node and every host exited 143.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, needs_torch
from netns import IP, Host, hosts_fixture
from test_membership_hosts import RESUMED, SAVED, Launches

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_torch]

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3")

PLAIN_DDP = ROOT / "tests" / "scripts" / "plain_ddp.py"


def job_file(tmp: Path, args: str, grow: str) -> Path:
    job = tmp / "job.yaml"
    job.write_text(
        f"name: keep-the-work\nengine: pytorch\nentry: {PLAIN_DDP}\nargs: [{args}]\nnodes: 3\nprocs_per_node: 2\n"
        f"log_dir: {tmp / 'logs'}\ncheckpoint: {{dir: {tmp / 'ckpt'}, grace_period: 20s, keep: 50}}\n"
        "restart: {max_restarts: 1, backoff: 0s}\nmonitor: {node_timeout: 3s}\n"
        f"pytorch: {{nnodes: '2:3'}}\nelastic: {{grow: {grow}}}\n"
    )
    return job


STEP = re.compile(r"step (\d+) loss \S+ model-checksum (\w+)")


def saves(run: Launches) -> dict[int, str]:
    """Every save node 0's rank 0 reported so far: step → the model it saved."""
    run.last("", host=0, since="")  # take in what arrived
    return {int(step): checksum for step, checksum in SAVED.findall(run.text(0))}


def trained_before(run: Launches, resumed: re.Match[str]) -> dict[int, str]:
    """step → the model after it, as rank 0 trained it before the ``resumed`` line (the newest time it ran)."""
    lines = run.text(0).splitlines()
    end = next(i for i, line in enumerate(lines) if resumed[0] in line)
    return {int(m[1]): m[2] for m in map(STEP.search, lines[:end]) if m}


@pytest.mark.parametrize("api", ["plain", "into"])
def test_a_shrink_then_a_grow_resume_from_the_newest_commit_of_each_size(
    tmp_path: Path, hosts3: list[Host], api: str
) -> None:
    extra = ", '--into'" if api == "into" else ""
    # 120 steps: after the shrink the job must outlast host 3's restart and its warm parent's imports (torch,
    # read from the start file), or the job ends before the candidate is ready to be admitted
    run = Launches(
        hosts3, job_file(tmp_path, f"'--steps', '120', '--save-every', '5'{extra}", "at_checkpoint"), MA_NUM_GPUS="2"
    )
    try:
        for index in range(3):
            run.start(index)
        run.wait_for(r"saved step (14|19): model-checksum", host=0)
        subprocess.run([IP, "-n", hosts3[2].ns, "link", "set", "eth0", "down"], check=True, timeout=10)
        cut = max(saves(run))
        shrunk = run.wait_for(RESUMED.pattern, host=0)
        # the newest commit: the last save before the cut (6 ranks wrote it), or a newer step the survivors
        # committed from memory after the node loss (``replicate: auto``: their 4 ranks wrote it)
        survivors = f"committed step {shrunk[1]} from the survivors' own ranks" in run.text(0)
        writers = "4" if survivors else "6"
        assert int(shrunk[1]) >= cut and (shrunk[2], shrunk[3]) == (writers, "4"), run.text()
        assert shrunk[4] == trained_before(run, shrunk)[int(shrunk[1])], run.text()  # the model of that step
        if api == "plain" and not survivors:
            assert "its state is replicated" in run.text(0), run.text()
        run.procs[2].wait(timeout=60)  # cut off, host 3's mlaunch gives up on the hub
        subprocess.run([IP, "-n", hosts3[2].ns, "link", "set", "eth0", "up"], check=True, timeout=10)
        run.start(2)
        run.wait_for(r"waits to be admitted at the next committed checkpoint", host=2)
        grown = run.wait_for(RESUMED.pattern, host=0)
        saved = saves(run)
        four_rank = max(s for s in saved if s <= int(grown[1]))
        assert int(grown[1]) == four_rank > int(shrunk[1]), run.text()  # the 4-rank job's newest commit
        assert (grown[2], grown[3]) == ("4", "6") and grown[4] == saved[four_rank], run.text()
        if api == "plain":  # 6 ranks load what 4 wrote: the plain API finds it replicated (as 4 did 6's)
            assert run.text(0).count("its state is replicated") == (1 if survivors else 2), run.text()
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    assert codes[0] == 0 and codes[1] == 0 and codes[2] == 0, text  # host 3's second mlaunch finished too
    assert "already committed" not in text and "cannot use step" not in text, text
    assert "final-checksum" in text and "WARNING" not in run.text(0), text


def test_a_member_preempted_while_a_candidate_waits_reforms_with_the_candidate(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    run = Launches(hosts3, job_file(tmp_path, "'--steps', '90', '--save-every', '5'", "at_restart"), MA_NUM_GPUS="2")
    try:
        for index in range(3):
            run.start(index)
        run.wait_for(r"saved step \d+: model-checksum", host=0)
        run.procs[1].kill()  # host 2's mlaunch killed: the job shrinks to hosts 1 and 3
        run.wait_for(RESUMED.pattern, host=0)
        run.procs[1].wait(timeout=30)
        run.start(1)  # started again: it waits to be admitted at the next restart
        run.wait_for(r"node 1: the job is already running; this node starts no ranks and waits", host=1)
        run.wait_for(r"step \d+ loss", host=0)
        time.sleep(1.0)
        reached = max(trained_before(run, run.wait_for(r"step \d+ loss", host=0)))
        run.procs[2].send_signal(signal.SIGTERM)  # host 3 preempted
        admitted = run.wait_for(r"node 1: admitted to the job at generation (\d+)", host=1)
        resumed = run.wait_for(RESUMED.pattern, host=0)
        lines = run.text(0).splitlines()
        upto = next(i for i, line in enumerate(lines) if resumed[0] in line)
        dying = {int(m[1]): m[2] for m in map(SAVED.search, lines[:upto]) if m}
        stop = max(dying)  # the graceful stop's save, every rank's: after the step reached when SIGTERM came
        assert stop >= reached and (int(resumed[1]), resumed[4]) == (stop, dying[stop]), run.text()
        assert (resumed[2], resumed[3]) == ("4", "4") and int(admitted[1]) >= 2, run.text()
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    assert codes == {0: 0, 1: 0, 2: 143}, text
    assert re.search(r"node 2 \(\S+\) left the job: its mlaunch was stopped by SIGTERM", run.text(0)), text
    assert "cannot restart together" not in text and "final-checksum" in text, text
