"""In-place recovery across two real hosts (network namespaces): a rank killed on host 1, host 0's ranks stay.

2 hosts × 2 ranks of ``tests/scripts/in_place_ddp.py`` (DDP over gloo on ``eth0``) under
``@elastic.recoverable``, started the ModelArts way (one mlaunch per host). Rank 3, on host 1, kills
itself with SIGKILL at step 15. What a user relies on: every other rank — both of host 0's and host
1's other rank — keeps its process (the same pid before and after), only rank 3 is a new process,
every step is trained once from the fault on (no committed step lost), both mlaunches exit 0, and the
training ends exactly as the same fault ends it in the local simulation of the same 2 × 2 job.
When the re-formed group never forms (a survivor on host 1 blocks before it rejoins), both hosts give up
on it within ``monitor.rejoin_timeout`` and the whole job restarts from the committed step, losing nothing.
A survivor on host 0 that never leaves the old attempt's wait is replaced after 8 s, and the others, on
both hosts, re-form in place once more.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch
from netns import Host, communicate_all, hosts_fixture
from test_in_place import final, pids_per_rank, steps_trained

pytestmark = [needs_torch, pytest.mark.netns, pytest.mark.slow]

SCRIPT = ROOT / "tests" / "scripts" / "in_place_ddp.py"


hosts = pytest.fixture(hosts_fixture(2), name="hosts")


def job_yaml(tmp: Path, iface: str, extra: str = "", at: int = 15) -> Path:
    (tmp / "steps").mkdir(parents=True, exist_ok=True)
    path = tmp / "job.yaml"
    path.write_text(
        f"name: in-place-hosts\nengine: pytorch\nentry: {SCRIPT}\n"
        f"args: [--fault, kill, --victim, '3', --steps, '30', --at, '{at}']\nnodes: 2\nprocs_per_node: 2\n"
        f"log_dir: {tmp / 'logs'}\nenv: {{IN_PLACE_LOG: {tmp / 'steps'}, GLOO_SOCKET_IFNAME: {iface}}}\n"
        f"checkpoint: {{dir: {tmp / 'ckpt'}}}\nrestart: {{max_restarts: 3}}\npreload: [torch]\n{extra}"
    )
    return path


def run_on_hosts(job: Path, hosts: list[Host]) -> tuple[list[tuple[int, str, str]], str]:
    """One mlaunch per host, started the ModelArts way; each one's (exit code, stdout, stderr) and a dump of all."""
    procs = []
    for host in hosts:
        env = clean_env(
            MA_NUM_GPUS="2",
            MA_NUM_HOSTS="2",
            VC_TASK_INDEX=str(host.index),
            VC_WORKER_HOSTS=",".join(h.name for h in hosts),
        )
        argv = [*mlaunch_cmd(), "--engine", "pytorch", str(job), "--init_method", f"tcp://{hosts[0].name}:6666"]
        argv += ["--rank", str(host.index), "--world_size", "2"]
        procs.append(host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = communicate_all(procs, 240)
    dump = "\n".join(
        f"--- host {i} exit {rc}\n{out[-2000:]}\n{err[-4000:]}" for i, (rc, out, err) in enumerate(outputs)
    )
    return outputs, dump


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The final checksum of the same 2 × 2 job and fault in the local simulation."""
    local = tmp_path_factory.mktemp("local")
    result = run_mlaunch(["--engine", "pytorch", str(job_yaml(local, "lo"))], env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return final(result.stdout)


def test_a_rank_killed_on_host_1_leaves_every_other_process_in_place(
    tmp_path: Path, hosts: list[Host], reference: str
) -> None:
    outputs, dump = run_on_hosts(job_yaml(tmp_path, "eth0"), hosts)
    assert [rc for rc, _, _ in outputs] == [0, 0], dump
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [1, 1, 1, 2], (pids, dump)  # only rank 3 is a new process
    assert "rank 0, rank 1 keep their processes and rejoin in place" in outputs[0][2], dump
    for rank in range(4):
        assert sorted(set(steps_trained(tmp_path, rank))) == list(range(30)), dump
    assert steps_trained(tmp_path, 3)[15] == 15, dump  # resumed right after the last step every rank staged
    assert final(outputs[0][1]) == reference, dump


def test_a_recovery_that_never_forms_across_hosts_restarts_the_whole_job(
    tmp_path: Path, hosts: list[Host], reference: str
) -> None:
    """Rank 3 is killed on host 1; rank 2, its survivor there, blocks before it rejoins (``IN_PLACE_STALL``): the
    group never forms on either host and nothing fails. Each host's mlaunch sees its ranks report nothing within
    ``monitor.rejoin_timeout`` (3 s here), and every rank on both hosts restarts from the committed step."""
    job = job_yaml(tmp_path, "eth0", extra="monitor: {rejoin_timeout: 3s}\n")
    job.write_text(job.read_text().replace("env: {", "env: {IN_PLACE_STALL: '2', "))
    outputs, dump = run_on_hosts(job, hosts)
    assert [rc for rc, _, _ in outputs] == [0, 0], dump
    both = outputs[0][2] + outputs[1][2]
    assert "the in-place recovery did not complete within 3s (monitor.rejoin_timeout)" in both, dump
    assert re.search(r"rank 2 is outside any collective wait; innermost frame: in_place_ddp.py:\d+ in stall_once", both)
    for _, _, err in outputs:  # every node restarts all its ranks, whichever noticed first
        assert "cannot recover in place: the last in-place recovery did not complete" in err, dump
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [2, 2, 2, 2], (pids, dump)  # every rank a new process after the stall
    for rank in range(4):
        assert sorted(set(steps_trained(tmp_path, rank))) == list(range(30)), dump  # nothing lost, nothing skipped
    assert final(outputs[0][1]) == reference, dump


def test_a_survivor_that_never_takes_its_go_on_host_0_is_replaced_and_the_others_stay(
    tmp_path: Path, hosts: list[Host], reference: str
) -> None:
    """Rank 3 is killed on host 1 at step 2 while rank 1, on host 0, sleeps there (``IN_PLACE_DEAF``: a wait its
    shut-down connections cannot end). Host 0's mlaunch kills rank 1 once it has slept in its call 1 s after its ``go``;
    ranks 0 and 2, cut off while forming the new group on two hosts, re-form in place once more with both
    replacements: they keep their processes throughout, no ``rejoin_timeout``, nothing lost."""
    job = job_yaml(tmp_path, "eth0", at=2)
    job.write_text(job.read_text().replace("env: {", "env: {IN_PLACE_DEAF: '1', "))
    outputs, dump = run_on_hosts(job, hosts)
    assert [rc for rc, _, _ in outputs] == [0, 0], dump
    said = r"rank 1 did not leave attempt 0's call within 1s of its go, asleep throughout"
    assert re.search(said, outputs[0][2]), dump
    both = outputs[0][2] + outputs[1][2]
    assert "cannot recover in place" not in both and "monitor.rejoin_timeout" not in both, dump
    for _, _, err in outputs:  # the other host heard the cause too: finishing a recovery, no crash-loop backoff
        assert re.search(r"restarting the group \(2/\d+\) in 0s", err), dump
    pids = pids_per_rank(tmp_path)
    assert [len(pids[r]) for r in range(4)] == [1, 2, 1, 2], (pids, dump)  # ranks 0 and 2 kept throughout
    for rank in range(4):
        assert sorted(set(steps_trained(tmp_path, rank))) == list(range(30)), dump
    assert final(outputs[0][1]) == reference, dump
