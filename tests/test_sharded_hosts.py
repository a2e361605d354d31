"""FSDP2 state flash-saved across real hosts (network namespaces): issue 23, item 2.

Two hosts × two ranks of examples/fsdp2, each host's mlaunch started the ModelArts way (gloo
over the hosts' own interfaces, the control plane between the two mlaunch). Rank 3, on host 2,
SIGKILLs itself after staging step 8: both mlaunch stop their ranks, agree through the control
plane on the newest step every rank staged, each writes its own ranks' DTensor shards from
shared memory, node 0 commits, both restart, and the resumed job ends with the final parameters
of an uninterrupted local run (same world size, same seed).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import EXAMPLES, clean_env, needs_torch, run_mlaunch
from netns import Host, hosts_fixture
from test_job_control_hosts import dump, finish, start, write_job

pytestmark = [needs_torch, pytest.mark.netns, pytest.mark.slow]

hosts2 = pytest.fixture(hosts_fixture(2), name="hosts2")
ARGS = "'--steps', '20', '--step-sleep', '0.05'"


def test_kill_9_on_host_2_flash_saves_fsdp2_shards_and_resumes_bit_identical(
    tmp_path: Path, hosts2: list[Host]
) -> None:
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    reference = run_mlaunch(
        [
            "--engine",
            "pytorch",
            str(write_job(ref_dir, nodes=2, procs=2, entry=EXAMPLES / "fsdp2" / "train.py", args=ARGS)),
        ],
        env=clean_env(GLOO_SOCKET_IFNAME="lo"),
    )
    assert reference.returncode == 0, reference.stderr
    expected = re.findall(r"final-checksum ([0-9a-f]+)", reference.stdout)
    assert len(expected) == 1, reference.stdout

    job = write_job(
        tmp_path, nodes=2, procs=2, entry=EXAMPLES / "fsdp2" / "train.py", args=f"{ARGS}, '--kill-rank-at', '3:8'"
    )
    results = finish(start(hosts2, job, 2))
    text = dump(results)
    assert [rc for rc, _, _ in results] == [0, 0], text
    committed = re.search(r"flash save after .*: committed step (\d+) from shared memory", results[0][2])
    assert committed, text
    step = int(committed.group(1))
    assert step >= 7, text
    assert f"resumed from step {step} (saved by 4 ranks, now 4)" in results[0][1], text
    assert re.findall(r"final-checksum ([0-9a-f]+)", results[0][1]) == expected, text
