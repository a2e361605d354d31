"""A stop signal to mlaunch that comes while it is already stopping its ranks for another reason still stops it.

A preemption does not wait for a convenient moment. A 300-fault storm (``python -m benchmarks.chaos``
seed 37, fault 140) SIGTERMed node 0's mlaunch 0.07 s into a re-form (a candidate admitted at a
checkpoint: every rank stopping gracefully); the re-form won, the SIGTERM was dropped, and node 0
trained on for 13 minutes — on a platform, until the SIGKILL at the end of the grace period, with
no dying checkpoint. The same hole was open after a failure: the SIGTERM was kept only for the exit
code, and the restart loop restarted the ranks anyway.

Here: the failure case with a real mlaunch on this machine (one rank fails, the other takes 4 s to
stop, mlaunch gets SIGTERM in between), and the outcome's rule itself. The re-form case runs on
network-namespace hosts in ``tests/test_membership_hosts.py``.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

from conftest import ROOT, clean_env, mlaunch_cmd

from launchers.outcome import outcome_of

SLOW_TO_STOP = """\
import os, signal, sys, time
rank = int(os.environ["RANK"])
def stop(*_):
    print(f"rank {rank} stops slowly", flush=True)
    time.sleep(4)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
if rank == 1:
    time.sleep(1.0)
    sys.exit(3)
while True:
    time.sleep(0.1)
"""


class _Ended:
    def __init__(self, label: str, returncode: int) -> None:
        self.label, self.returncode = label, returncode


def test_a_stop_signal_wins_over_a_membership_change() -> None:
    ranks = [_Ended("rank 0", 143)]
    reformed = outcome_of(ranks, None, None, grace_expired=False, stop_started=1.0, change="node 2 left")
    assert (reformed.status, reformed.exit_code) == ("reformed", 0)
    stopped = outcome_of(ranks, None, signal.SIGTERM, grace_expired=False, stop_started=1.0, change="node 2 left")
    assert (stopped.status, stopped.exit_code, stopped.signal) == ("signalled", 143, signal.SIGTERM)


def test_sigterm_while_stopping_after_a_failure_ends_the_run_without_a_restart(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SLOW_TO_STOP)
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: {script}\nengine: pytorch\nnodes: 1\nprocs_per_node: 2\nlog_dir: {tmp_path / 'logs'}\n"
        "restart: {max_restarts: 3, backoff: 0s}\ncheckpoint: {grace_period: 20s}\n"
    )
    proc = subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
        env=clean_env(),
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: list[str] = []
    stopping = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "rank 0 stops slowly" in line:
                stopping.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert stopping.wait(120), "".join(lines)  # rank 1 failed; mlaunch is stopping rank 0 (4 s)
        proc.send_signal(signal.SIGTERM)  # the platform preempts the node in that window
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    out = "".join(lines)
    assert code == 143, out
    assert "while stopping after the failure; not restarting" in out, out
    assert "restarting the group" not in out, out
    assert out.count("rank 0 stops slowly") == 1, out  # no second attempt was started
