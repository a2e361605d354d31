"""``monitor.hang_timeout: auto`` on real ranks (1 node × 4, gloo on CPU) through real ``mlaunch``.

A rank SIGSTOPs itself (a process stuck in the kernel or a driver looks the same): judged hung
within the learned limit and named as the culprit — stopped, not "outside any collective wait" —
while the three others are named as waiting in a collective from their stacks (the script wraps
nothing in ``elastic.waiting()``). And a fault-free run whose evaluation and checkpoint steps take
10 × a normal step, beyond the floor, is never judged hung. The decision itself is tested in
``tests/test_hang_limit.py``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import ROOT, needs_torch
from test_hang import Run

from launchers.observe.events_log import read_events
from launchers.observe.hang_limit import FLOOR, K

SCRIPT = ROOT / "tests" / "scripts" / "hang_auto.py"


def auto_job(tmp: Path, extra: str = "") -> Path:
    job = tmp / "job.yaml"
    job.write_text(
        f"name: hang-auto\nengine: pytorch\nentry: {SCRIPT}\nnodes: 1\nprocs_per_node: 4\n"
        f"log_dir: {tmp / 'logs'}\nrestart: {{max_restarts: 0}}\n{extra}"  # hang_timeout: auto, the default
    )
    return job


@needs_torch
def test_a_sigstopped_rank_is_judged_hung_within_the_learned_limit_and_named_as_stopped(tmp_path: Path) -> None:
    step = 0.3
    env = {"STEPS": "200", "STEP_TIME": str(step), "STOP_RANK": "1", "STOP_STEP": "8", "GLOO_SOCKET_IFNAME": "lo"}
    run = Run(auto_job(tmp_path), OUT_DIR=str(tmp_path), **env)
    code = run.finish(120)
    assert code == 137, run.text
    stopped = run.first(r"rank 1 stops itself at step 8")
    hung = run.first(r"rank (\d) \(pid \d+\) hung: no progress for ([\d.]+)s \(monitor.hang_timeout: auto")
    assert stopped and hung, run.text
    assert hung[1].group(1) == "1", run.text  # the stopped rank, not the last of the waiting ones
    latency = hung[0] - stopped[0]
    assert latency <= K * step + FLOOR + 2, latency  # + 2 s: a loaded machine, as test_hang's bounds
    assert "rank 1: stopped (process state T: SIGSTOP or a debugger); the culprit" in run.text, run.text
    (event,) = [e for e in read_events(tmp_path / "logs" / "events.jsonl") if e["event"] == "hang"]
    assert event["rank"] == 1 and event["outside_collective"] == [1], event
    assert sorted(event["in_collective"]) == [0, 2, 3], event  # told by their stacks: all_reduce
    assert event["stuck"] == {"1": "stopped (process state T: SIGSTOP or a debugger)"}, event
    assert event["hang_limit_s"] == FLOOR and event["slowest_step_s"] < 1.0, event
    cause = event["cause"]
    waiter = r"rank \d \([^)]*\) in distributed_c10d.py:\d+ in all_reduce"
    assert re.search(rf"waiting in a collective: {waiter}, {waiter}, {waiter}$", cause), cause
    assert "outside any collective wait" not in cause, cause


@needs_torch
@pytest.mark.slow
def test_evaluation_and_checkpoint_steps_ten_times_a_step_beyond_the_floor_are_never_judged_hung(
    tmp_path: Path,
) -> None:
    """The first evaluation and the first checkpoint are longer than any step seen and than the floor.

    Every rank evaluates (Python between small batches), then rank 0 writes while the others wait in
    a barrier (no Python there): rank 0 still runs Python, so its node declares nothing. Without
    that question, the first evaluation is judged hung at the floor.
    """
    step = 1.1
    assert 10 * step > FLOOR
    env = {"STEPS": "8", "STEP_TIME": str(step), "SLOW_EVERY": "4", "SLOW_FACTOR": "10", "GLOO_SOCKET_IFNAME": "lo"}
    started = time.monotonic()
    run = Run(auto_job(tmp_path), OUT_DIR=str(tmp_path), **env)
    code = run.finish(180)
    assert code == 0, run.text
    assert len(re.findall(r"rank \d finished", run.text)) == 4, run.text
    assert "hung" not in run.text, run.text
    assert time.monotonic() - started > 2 * 10 * step  # the slow steps did take their time
    assert not [e for e in read_events(tmp_path / "logs" / "events.jsonl") if e["event"] in ("hang", "failure")]
