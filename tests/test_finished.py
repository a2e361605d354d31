"""A finished job is never turned into a failure by an abort in teardown (issue 30 item 2).

Real mlaunch and real processes (2 simulated nodes × 2 ranks, no framework: the abort in
torch's C++ teardown that DeepSpeed jobs showed is played by ``os.abort()`` after the last step).
A rank that called ``elastic.finished()`` and then aborts: the job ends 0, says what happened,
and is neither restarted nor flash-saved. The same abort without ``finished()`` is a failure that
uses a restart, as before.
"""

from __future__ import annotations

from pathlib import Path

from conftest import clean_env, run_mlaunch

SCRIPT = """\
import os, sys, time
from launchers import elastic
rank = int(os.environ["RANK"])
if {finished}:
    elastic.finished()
time.sleep(0.5)
if rank == 3:
    sys.stderr.flush()
    os.abort()  # terminate called without an active exception
"""


def job(tmp: Path, finished: bool) -> Path:
    script = tmp / "train.py"
    script.write_text(SCRIPT.format(finished=finished))
    path = tmp / "job.yaml"
    path.write_text(
        f"entry: {script}\nengine: pytorch\nnodes: 2\nprocs_per_node: 2\nlog_dir: {tmp / 'logs'}\n"
        "restart: {max_restarts: 1, backoff: 0s}\n"
    )
    return path


def test_an_abort_after_every_rank_finished_is_reported_and_the_job_ends_0(tmp_path: Path) -> None:
    result = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, True))], env=clean_env())
    err = result.stderr
    assert result.returncode == 0, err
    assert "rank 3" in err and "after it reported that its training finished: an abort in interpreter teardown" in err
    assert "aborted in interpreter teardown (exit code 0: the training completed)" in err
    assert "restarting the group" not in err and "flash save" not in err


def test_the_same_abort_without_finished_is_a_failure(tmp_path: Path) -> None:
    result = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, False))], env=clean_env())
    assert result.returncode == 134, result.stderr
    assert "restarting the group (1/1)" in result.stderr
