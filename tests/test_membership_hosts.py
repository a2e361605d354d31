"""Elastic membership across real hosts (issue 27): 3 network-namespace hosts, ``pytorch.nnodes: "2:3"``.

One mlaunch per host the ModelArts way (``--init_method tcp://HOST0:6666 --rank I --world_size 3``),
real gloo training across the hosts' ``eth0``, one rank per host:

- the DDP example (through the chaos wrapper, which prints each rank's pid): host 3's mlaunch is
  SIGKILLed → hosts 1-2 go on as a 2-node job from the newest committed step with the model it
  saved, their ranks see a consistent 2-node job (``RANK``/``WORLD_SIZE`` and the platform's
  ``MA_NUM_HOSTS``/``VC_TASK_INDEX``/``VC_WORKER_HOSTS``); host 3's mlaunch started again waits
  without ranks; a rank killed on host 2 restarts the job and host 3 is admitted there
  (``elastic.grow: at_restart``), resuming from the flash-saved step; the job ends on every host;
- the FSDP2 example: the same shrink, then host 3 is admitted after the next committed
  checkpoint (``elastic.grow: at_checkpoint``: every rank stops gracefully and saves, all restart
  with 3), resharded each time, the model after each load equal to the saved one;
- the health check with ``on_failure: exclude``: host 3's link rate-limited → it exits 75, hosts
  1-2 train as a 2-node job to the same final parameters as a 2-node run;
- host 3's link down (silence, no closed connection): the same shrink after ``node_timeout``;
- node 0's mlaunch SIGKILLed: the hub moves and the others go on (tests/test_hub_moves_hosts.py).

These jobs run with ``checkpoint.replicate: off``: they check that a shrink resumes from the newest
*committed* step. With replication (the default) the survivors commit the newest *staged* step
first: ``test_replicas_hosts.py``.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch
from netns import Host, hosts_fixture

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import CHAOS, final_checksum  # noqa: E402

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_torch]

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3")

FSDP2 = ROOT / "examples" / "fsdp2" / "train.py"
NODE_TIMEOUT = 3.0
SAVED = re.compile(r"saved step (\d+): model-checksum (\w+)")
RESUMED = re.compile(r"resumed from step (\d+) .*\(saved by (\d+) ranks, now (\d+)\): model-checksum (\w+)")


def write_job(tmp: Path, entry: Path, args: str, extra: str = "") -> Path:
    job = tmp / "job.yaml"
    job.write_text(
        f"name: elastic\nengine: pytorch\nentry: {entry}\nargs: [{args}]\nnodes: 3\nprocs_per_node: 1\n"
        f"log_dir: {tmp / 'logs'}\ncheckpoint: {{dir: {tmp / 'ckpt'}, grace_period: 20s, keep: 50, replicate: off}}\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\nmonitor: {{node_timeout: {NODE_TIMEOUT}s}}\n"
        f"pytorch: {{nnodes: '2:3'}}\n{extra}"
    )
    return job


class Launches:
    """One mlaunch per host; every line of their output, in arrival order, with the host's index."""

    def __init__(self, hosts: list[Host], job: Path, **env: str) -> None:
        self.hosts, self.job, self.env = hosts, job, env
        self.gpus = env.pop("MA_NUM_GPUS", "1")  # processes per host
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.lines: queue.Queue[tuple[int, str]] = queue.Queue()
        self.seen: list[tuple[int, str]] = []

    def start(self, index: int) -> None:
        hosts = self.hosts
        env = clean_env(
            MA_NUM_GPUS=self.gpus,
            MA_NUM_HOSTS=str(len(hosts)),
            VC_TASK_INDEX=str(index),
            VC_WORKER_HOSTS=",".join(h.name for h in hosts),
            GLOO_SOCKET_IFNAME="eth0",
            **self.env,
        )
        argv = [*mlaunch_cmd(), "--engine", "pytorch", str(self.job), "--init_method", f"tcp://{hosts[0].name}:6666"]
        argv += ["--rank", str(index), "--world_size", str(len(hosts))]
        proc = hosts[index].popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs[index] = proc
        threading.Thread(target=self._pump, args=(index, proc), daemon=True).start()

    def start_all(self) -> Launches:
        """Every host's mlaunch; the ones already started are killed when one cannot start."""
        try:
            for index in range(len(self.hosts)):
                self.start(index)
        except BaseException:
            self.kill()
            raise
        return self

    def _pump(self, index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put((index, line.rstrip("\n")))

    def wait_for(self, pattern: str, host: int | None = None, timeout: float = 120) -> re.Match[str]:
        """The first line from now on (of ``host``, else any) matching ``pattern``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                index, line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append((index, line))
            found = re.search(pattern, line)
            if found and host in (None, index):
                return found
        raise AssertionError(f"no line matching {pattern!r} in {timeout}s:\n{self.text()}")

    def last(self, pattern: str, host: int, since: str) -> re.Match[str] | None:
        """The newest line of ``host`` matching ``pattern`` after the first line containing ``since``."""
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        start = next((i for i, (_, line) in enumerate(self.seen) if since in line), len(self.seen))
        found = [re.search(pattern, line) for i, line in self.seen[start:] if i == host]
        return next((m for m in reversed(found) if m), None)

    def finish(self, timeout: float = 180) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        try:
            codes = {i: p.wait(timeout=max(1.0, deadline - time.monotonic())) for i, p in self.procs.items()}
        finally:
            self.kill()
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return codes

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def text(self, host: int | None = None) -> str:
        return "\n".join(f"[host {i + 1}] {line}" for i, line in self.seen if host in (None, i))


def membership_events(log_dir: Path) -> list[dict[str, object]]:
    lines = (log_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "membership" and e.get("node") == 0]


def start_ddp(tmp_path: Path, hosts: list[Host], steps: int, **env: str) -> Launches:
    """The DDP example (through the chaos wrapper) on the 3 hosts, a save every 5 steps, one mlaunch per host."""
    state = tmp_path / "chaos"
    state.mkdir()
    job = write_job(tmp_path, CHAOS, f"'--steps', '{steps}', '--save-every', '5', '--workers', '0'")
    return Launches(hosts, job, CHAOS_STATE=str(state), CHAOS_STEP_SLEEP="0.1", **env).start_all()


def shrink(run: Launches) -> tuple[int, str]:
    """Host 3's mlaunch SIGKILLed after a save: the 2-host job resumes the newest step, the model it saved."""
    saved = run.wait_for(r"saved step (9|1\d): model-checksum", host=0)
    run.procs[2].kill()
    resumed = run.wait_for(RESUMED.pattern, host=0)
    text = run.text()
    checksums = {int(step): checksum for step, checksum in SAVED.findall(run.text(0))}  # every save before
    assert re.search(r"membership \(generation 1\): 3 → 2 nodes .*; left: 2 \(\S+\): its mlaunch", text), text
    assert int(resumed[1]) == max(checksums) >= int(saved[1]), text  # the newest committed step, none lost
    assert (resumed[2], resumed[3]) == ("3", "2") and resumed[4] == checksums[int(resumed[1])], text
    return int(resumed[1]), resumed[4]


def test_ddp_shrinks_to_two_hosts_and_takes_the_third_back_at_the_next_restart(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    shown = "RANK,WORLD_SIZE,NODE_RANK,MA_NUM_HOSTS,VC_TASK_INDEX,VC_WORKER_HOSTS"
    run = start_ddp(tmp_path, hosts3, 70, CHAOS_SHOW_ENV=shown)
    try:
        shrink(run)
        run.wait_for(r"step \d+ loss", host=0)  # the 2-host job steps: its ranks have all started
        pid = run.last(r"chaos pid 1 (\d+)", host=1, since="left the job")
        shown = run.last(r"chaos env 1 (.*)", host=1, since="left the job")
        assert pid and shown, run.text()
        rank1 = int(pid[1])
        names = ",".join(h.name for h in hosts3[:2])
        assert shown[1] == f"RANK=1 WORLD_SIZE=2 NODE_RANK=1 MA_NUM_HOSTS=2 VC_TASK_INDEX=1 VC_WORKER_HOSTS={names}"
        run.start(2)  # the platform restarted host 3's pod
        run.wait_for(r"node 2: the job is already running; this node starts no ranks and waits", host=2)
        time.sleep(1)
        os.kill(rank1, signal.SIGKILL)  # a failure: the job restarts, and admits host 3 there
        run.wait_for(r"node 2: admitted to the job at generation 2", host=2)
        grown = run.wait_for(RESUMED.pattern, host=0)
        # The newest step committed before: the ranks' own save, or the flash save after the kill (none when
        # the kill came right after a save: the newest staged step is the committed one).
        before = run.text(0)
        committed = [int(m) for m in re.findall(r"saved step (\d+): model-checksum", before)]
        committed += [int(m) for m in re.findall(r"flash save after .*: committed step (\d+)", before)]
        # the ranks' own save committed it, and mlaunch's SIGKILL came before rank 0 printed "saved step" (CI)
        committed += [
            int(m) for m in re.findall(r"step (\d+), the newest every rank staged, was already committed", before)
        ]
        assert int(grown[1]) == max(committed) and (grown[2], grown[3]) == ("2", "3"), run.text()
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    assert codes == {0: 0, 1: 0, 2: 0}, text
    assert final_checksum(text), text
    changes = membership_events(tmp_path / "logs")
    assert [(e["nodes_before"], e["nodes_after"]) for e in changes] == [(3, 2), (2, 3)], changes
    assert "'node': 2" in str(changes[0]["left"]) and "'node': 2" in str(changes[1]["joined"]), changes


def test_fsdp2_shrinks_and_grows_at_the_next_checkpoint_resharding_each_time(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    args = "'--steps', '60', '--save-every', '5', '--step-sleep', '0.1'"
    job = write_job(tmp_path, FSDP2, args, extra="elastic: {grow: at_checkpoint}\n")
    run = Launches(hosts3, job)
    try:
        for index in range(3):
            run.start(index)
        step, _ = shrink(run)
        run.start(2)
        run.wait_for(r"waits to be admitted at the next committed checkpoint", host=2)
        regroup = run.wait_for(r"wait to join and step (\d+) is committed", host=0)
        assert int(regroup[1]) > step, run.text()
        since = len(run.seen)
        grown = run.wait_for(RESUMED.pattern, host=0)
        # the graceful stop's save: the newest before the grown job resumed (a periodic save can land
        # between the regroup and the stop: CI saw "saved step 29" then the dying "saved step 30")
        dying = [m for i, line in run.seen[since:] if i == 0 and (m := SAVED.search(line))][-1]
        assert (grown[1], grown[2], grown[3], grown[4]) == (dying[1], "2", "3", dying[2]), run.text()
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    assert codes == {0: 0, 1: 0, 2: 0} and final_checksum(text), text
    assert re.search(r"\[host 3\] mlaunch: node 2: \d+ warm standby workers ready; ready to be admitted", text), text
    status = json.loads((tmp_path / "logs" / "status.json").read_text())
    assert status["membership"]["members"] == [0, 1, 2] and status["membership"]["regroup"], status
    shown = run_mlaunch(["status", str(job)], env=clean_env(COLUMNS="400")).stdout  # what a person reads
    assert re.search(r"membership at attempt \d+: 2 → 3 nodes \(2 → 3 ranks\); nodes in the job: 0, 1, 2", shown), shown
    assert "joined: node 2 (" in shown and "regrouped: " in shown, shown


def test_health_check_exclude_leaves_the_slow_host_out_and_the_others_train(tmp_path: Path, hosts3: list[Host]) -> None:
    from health_faults import slow_link

    args = "'--steps', '16', '--save-every', '8', '--workers', '0'"
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    reference = write_job(ref_dir, CHAOS, args)
    reference.write_text(
        reference.read_text().replace("nodes: 3", "nodes: 2").replace("pytorch: {nnodes: '2:3'}\n", "")
    )
    expected = run_mlaunch(["--engine", "pytorch", str(reference)], env=clean_env(GLOO_SOCKET_IFNAME="lo"))
    assert expected.returncode == 0, expected.stderr
    slow_link(hosts3[2])
    job = write_job(tmp_path, CHAOS, args, extra="health_check: {before_start: true, on_failure: exclude}\n")
    run = Launches(hosts3, job)
    try:
        for index in range(3):
            run.start(index)
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    assert codes == {0: 0, 1: 0, 2: 75}, text
    assert "health check: this node is excluded" in run.text(2) and "starting without" in run.text(0), text
    assert re.search(r"membership \(generation 0\): 3 → 2 nodes", run.text(0)), text
    assert final_checksum(text) == final_checksum(expected.stdout), text


def test_ddp_shrinks_when_a_hosts_link_goes_down(tmp_path: Path, hosts3: list[Host]) -> None:
    """Host 3's link down (no connection closes: its mlaunch is silent past node_timeout, its peers' gloo
    collectives block on it): hosts 1-2 leave it out, stop their blocked ranks and go on as a 2-node job
    from the newest committed step; host 3's mlaunch, cut off, gives up on the hub and exits non-zero."""
    from netns import IP

    run = start_ddp(tmp_path, hosts3, 40)
    try:
        run.wait_for(r"saved step (9|1\d): model-checksum", host=0)
        subprocess.run([IP, "-n", hosts3[2].ns, "link", "set", "eth0", "down"], check=True, timeout=10)
        resumed = run.wait_for(RESUMED.pattern, host=0)
        codes = run.finish()
    finally:
        run.kill()
    text = run.text()
    checksums = {int(step): checksum for step, checksum in SAVED.findall(run.text(0))}
    assert re.search(r"membership \(generation 1\): 3 → 2 nodes .*; left: 2 \(\S+\): its mlaunch sent nothing", text)
    saved_before = [s for s in checksums if s <= int(resumed[1])]
    assert int(resumed[1]) == max(saved_before) and resumed[4] == checksums[int(resumed[1])], text
    assert (resumed[2], resumed[3]) == ("3", "2"), text
    assert codes[0] == 0 and codes[1] == 0 and codes[2] != 0, text
    assert final_checksum(text), text


SLOW_TO_STOP = """\
import os, signal, sys, time
def stop(*_):
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} stops slowly", flush=True)
    time.sleep(4)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
while True:
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} ticks", flush=True)
    time.sleep(0.3)
"""


def test_node_0_preempted_while_the_job_re_forms_stops_instead_of_re_forming(
    tmp_path: Path, hosts3: list[Host]
) -> None:
    """A 300-fault storm (seed 37, fault 140) SIGTERMed node 0's mlaunch during a re-form: the re-form won,
    the SIGTERM was dropped and node 0 trained on (on a platform: until its SIGKILL, with no dying
    checkpoint). Here host 3 is preempted, node 0's rank takes 4 s to stop for the re-form, and node 0's
    mlaunch is SIGTERMed in that window: it exits 143 and never starts the 2-node generation."""
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    run = Launches(hosts3, write_job(tmp_path, script, ""))
    try:
        for index in range(3):
            run.start(index)
        for index in range(3):
            run.wait_for(r"rank \d of 3 ticks", host=index)
        run.procs[2].send_signal(signal.SIGTERM)  # host 3 preempted: it leaves, the others re-form without it
        run.wait_for(r"rank 0 of 3 stops slowly", host=0)  # node 0's rank stopping for the re-form (4 s)
        run.procs[0].send_signal(signal.SIGTERM)  # node 0 preempted in that window
        code = run.procs[0].wait(timeout=60)
        run.finish(timeout=30)
    finally:
        run.kill()
    mine = run.text(0)
    assert code == 143, mine
    assert "stopped by SIGTERM; exit code 143" in mine, mine
    assert not re.search(r"membership \(generation \d+\): 3 → 2 nodes", mine), mine
    assert "rank 0 of 2" not in run.text(), run.text()  # no 2-node generation started anywhere


def test_a_host_whose_mlaunch_never_starts_is_left_out_after_the_last_call(tmp_path: Path, hosts3: list[Host]) -> None:
    """`nnodes: "2:3"`, `elastic.last_call: 2s`: hosts 1-2 start, host 3's mlaunch does not (a pod that never came
    up; in a storm, one killed before its hello reached node 0) — the two start without it after the last call,
    and when host 3's mlaunch does start it waits as a candidate instead of joining a running generation."""
    script = tmp_path / "slow_to_stop.py"
    script.write_text(SLOW_TO_STOP)
    run = Launches(hosts3, write_job(tmp_path, script, "", "elastic: {last_call: 2s}\n"))
    try:
        run.start(0)
        run.start(1)
        started = time.monotonic()
        run.wait_for(r"rank \d of 2 ticks", host=0)
        assert time.monotonic() - started >= 2.0, run.text()  # the last call was waited for
        run.start(2)
        run.wait_for(r"node 2: the job is already running; this node starts no ranks", host=2)
    finally:
        run.kill()
    mine = run.text(0)
    assert re.search(r"membership \(generation 0\): 3 → 2 nodes .*never reached the control plane", mine), mine
    assert "of 3 ticks" not in run.text(), run.text()
