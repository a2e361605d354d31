"""Exact on several hosts as people write DDP (issue 48): 3 network-namespace hosts × 2 ranks.

The script (``tests/scripts/ddp_state_dict.py --loader-workers 2``) is DDP with default buckets, fed by a plain
shuffled ``DataLoader`` with worker processes through a ``DistributedSampler``, staging its module's own
``state_dict()`` every step: it never hands the DDP wrapper to mlaunch. One mlaunch per host, the ModelArts way.
A kill -9 of a rank on host 3, then a 1 s link flap on host 2 after the restart: the run ends with the final
parameters of its fault-free twin, bit for bit (6 ranks: DDP's bucket layout decides gloo's summation order, and
the resumed DDP gets the layout its predecessor rebuilt, ``launchers.elastic.ddp_layouts``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, needs_torch
from netns import IP, Host, hosts_fixture
from test_membership_hosts import Launches

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import final_checksum  # noqa: E402

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_torch]

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3")
SCRIPT = ROOT / "tests" / "scripts" / "ddp_state_dict.py"
STEPS = 30


def start(tmp: Path, hosts: list[Host], name: str) -> Launches:
    work = tmp / name
    work.mkdir()
    job = work / "job.yaml"
    job.write_text(
        f"name: exact-{name}\nengine: pytorch\nentry: {SCRIPT}\n"
        f"args: ['--steps', '{STEPS}', '--save-every', '10', '--step-time', '0.1', '--loader-workers', '2', "
        f"'--output', '{work / 'ckpt'}']\n"
        f"nodes: 3\nprocs_per_node: 2\nlog_dir: {work / 'logs'}\n"
        f"checkpoint: {{dir: {work / 'ckpt'}, grace_period: 20s}}\nrestart: {{max_restarts: 3, backoff: 0s}}\n"
    )
    return Launches(hosts, job, MA_NUM_GPUS="2", PYTHONPATH=str(ROOT)).start_all()


def finished(run: Launches) -> str:
    codes = run.finish(timeout=240)
    text = run.text()
    assert codes == {0: 0, 1: 0, 2: 0}, (codes, text[-8000:])
    checksum = final_checksum(run.text(0))
    assert checksum, text[-8000:]
    return checksum


def test_ddp_staging_its_module_state_dict_with_loader_workers_ends_as_its_fault_free_twin(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    reference = start(tmp_path, hosts3, "fault-free")
    try:
        expected = finished(reference)
    finally:
        reference.kill()

    run = start(tmp_path, hosts3, "faulted")
    try:
        pid = run.wait_for(r"\[rank 5\] rank 5 pid (\d+)", host=2)
        run.wait_for(r"\[rank 5\] rank 5 step 7\b", host=2)
        os.kill(int(pid[1]), signal.SIGKILL)
        resumed = run.wait_for(r"\[rank 5\] rank 5 start (\d+)", host=2)
        assert int(resumed[1]) >= 7, run.text()[-8000:]  # the flash save kept every staged step
        run.wait_for(rf"rank 3 step {int(resumed[1]) + 3}\b", host=1)
        subprocess.run([IP, "-n", hosts3[1].ns, "link", "set", "eth0", "down"], check=True, timeout=10)
        time.sleep(1.0)
        subprocess.run([IP, "-n", hosts3[1].ns, "link", "set", "eth0", "up"], check=True, timeout=10)
        got = finished(run)
    finally:
        run.kill()
    text = run.text()
    assert "may differ" not in text, text[-8000:]  # no resume said it was only close
    assert got == expected, f"the faulted run ends elsewhere:\n{text[-8000:]}"
    assert re.search(rf"rank 0 step {STEPS}\b", run.text(0)), text[-8000:]
