"""Chaos suite: faults during deterministic 2 × 2 DDP training (gloo, CPU), and nothing is lost.

Every test runs the real example (examples/pytorch/train.py) through real ``mlaunch``, with
faults injected by tests/scripts/chaos_train.py (signals and SIGKILLs from inside, at chosen
steps) or sent by the test itself (signals to mlaunch or to one worker's pid). "Nothing
lost" is checked the strict way: after the faults, the run resumes and ends with the same
``final-checksum`` as an uninterrupted run with the same seed.

Slow storage is a sleep in the shard writer's test hook (``durable.before_fill``), set by the
wrapper for one chosen save, and in mlaunch through tests/scripts/slow_storage; disk full is a
real, small tmpfs (skipped when mounting is refused). Issue 4's list, items 1-8; item 8 (ten mixed faults) is ``slow``.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch

from launchers.elastic.format import layout, shardfile

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import (  # noqa: E402
    CHAOS,
    alive,
    children,
    fill,
    final_checksum,
    run_id_of,
    slow_storage_env,
    tmpfs,
    wait_for,
)

pytestmark = needs_torch
STEPS = 24


def write_job(
    tmp: Path, *, steps: int = STEPS, grace: str = "20s", restarts: int = 0, args: str = "", extra: str = ""
) -> Path:
    job = tmp / "job.yaml"
    job.write_text(
        f"name: chaos\nengine: pytorch\nentry: {CHAOS}\nargs: ['--steps', '{steps}', '--save-every', '4'{args}]\n"
        f"nodes: 2\nprocs_per_node: 2\nenv: {{GLOO_SOCKET_IFNAME: lo}}\nlog_dir: {tmp / 'logs'}\n"
        f"checkpoint: {{dir: {tmp / 'ckpt'}, grace_period: {grace}, keep: 10}}\n"
        f"restart: {{max_restarts: {restarts}, backoff: 0s}}\n{extra}"
    )
    return job


class Run:
    """mlaunch in the background; its output collected line by line."""

    def __init__(self, job: Path, **env: str) -> None:
        self.proc = subprocess.Popen(
            [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
            env=clean_env(**env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _pump(stream: object, sink: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink.append(line.rstrip("\n"))

    def pids(self) -> dict[int, int]:
        """rank → pid of the newest process of each rank."""
        found: dict[int, int] = {}
        for line in list(self.out):
            if m := re.search(r"chaos pid (\d+) (\d+)$", line):
                found[int(m.group(1))] = int(m.group(2))
        return found

    def step(self) -> int:
        steps = [int(m.group(1)) for line in list(self.out) if (m := re.search(r"\] step (\d+) loss", line))]
        return max(steps, default=-1)

    def wait_step(self, step: int, timeout: float = 120) -> None:
        assert wait_for(lambda: self.step() >= step and len(self.pids()) == 4, timeout), self.dump()

    def finish(self, timeout: float = 180) -> int:
        code = self.proc.wait(timeout=timeout)
        time.sleep(0.2)  # the pumps read what is left
        return code

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def dump(self) -> str:
        return self.stdout[-3000:] + "\n---\n" + self.stderr[-3000:]


def rerun(tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The same job again, without faults: it must resume and finish."""
    result = run_mlaunch(["--engine", "pytorch", str(tmp / "job.yaml")], env=clean_env(**env), timeout=300)
    assert result.returncode == 0, result.stderr
    return result


def shard_steps(path: Path) -> set[int]:
    return {int(shardfile.read_meta(path / layout.shard_name(r))["step"]) for r in range(4)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """final-checksum of uninterrupted runs, per step count."""
    sums = {}
    for steps in (STEPS,):
        tmp = tmp_path_factory.mktemp(f"reference{steps}")
        result = run_mlaunch(["--engine", "pytorch", str(write_job(tmp, steps=steps))], timeout=300)
        assert result.returncode == 0, result.stderr
        checksum = final_checksum(result.stdout)
        assert checksum
        sums[steps] = checksum
    return sums


# 1 ----------------------------------------------------------------------------------------


def test_1_sigterm_to_rank_0_mid_step_stops_every_rank_at_that_step(tmp_path: Path, reference: dict[int, str]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    job = write_job(tmp_path)
    run = Run(job, CHAOS_PLAN="0:9:term", CHAOS_STATE=str(state))
    code = run.finish()
    assert code == 143, run.dump()
    assert "received SIGTERM; will stop at the next step boundary" in run.stderr
    followers = [line for line in run.err if line.startswith("[node") and "another rank was signalled" in line]
    assert len(followers) == 3 and all(line.endswith("stopping at step 9") for line in followers), run.dump()
    committed = layout.committed(tmp_path / "ckpt")
    assert [c.step for c in committed] == [9, 7, 3]  # the dying save, after the periodic ones
    assert committed[0].manifest["source"] == "save" and shard_steps(committed[0].path) == {9}
    assert not layout.partial_dirs(tmp_path / "ckpt")
    resumed = rerun(tmp_path)
    assert "resumed from step 9" in resumed.stdout
    assert final_checksum(resumed.stdout) == reference[STEPS]


def test_1_sigterm_to_rank_1_only_every_rank_agrees(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    run = Run(job, CHAOS_STEP_SLEEP="0.05")
    run.wait_step(6)
    os.kill(run.pids()[1], signal.SIGTERM)  # one worker only, not mlaunch
    code = run.finish()
    assert code == 143, run.dump()
    stops = [
        m.group(1) for line in run.err if line.startswith("[node") and (m := re.search(r"stopping at step (\d+)", line))
    ]
    assert len(stops) == 3 and len(set(stops)) == 1, run.dump()  # ranks 0, 2, 3 followed rank 1
    step = int(stops[0])
    newest = layout.committed(tmp_path / "ckpt")[0]
    assert newest.step == step and shard_steps(newest.path) == {step}
    assert re.findall(r"exited with code (\d+)", run.stderr)[:1] == ["143"]


# 2 ----------------------------------------------------------------------------------------


def test_2_kill_9_mid_step_agent_commits_the_staged_step_and_restart_resumes(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    job = write_job(tmp_path, restarts=1)
    run = Run(job, CHAOS_STEP_SLEEP="0.05")
    run.wait_step(9)
    os.kill(run.pids()[2], signal.SIGKILL)
    assert run.finish() == 0, run.dump()
    flash = re.search(r"flash save after node 1 rank 2 failed: committed step (\d+) from shared memory", run.stderr)
    assert flash, run.dump()
    step = int(flash.group(1))
    # rank 0 printed step 9: its all-reduce of step 9 needed every rank done with step 8, staging included;
    # rank 2 may have been killed between step 9's all-reduce and staging it
    assert step >= 8, run.dump()
    assert f"resumed from step {step}" in run.stdout
    assert final_checksum(run.stdout) == reference[STEPS]


def test_2_ranks_hung_in_a_collective_at_sigterm_agent_commits_the_staged_step(
    tmp_path: Path, reference: dict[int, str]
) -> None:
    """Rank 3 hangs; the others block in the step's all-reduce and cannot run their handlers.

    On SIGTERM mlaunch keeps the end of the grace period for itself: it SIGKILLs the stuck
    workers early enough to persist their newest staged step, and that step is committed.
    """
    state = tmp_path / "state"
    state.mkdir()
    job = write_job(tmp_path, grace="6s")
    run = Run(job, CHAOS_PLAN="3:10:hang", CHAOS_STATE=str(state))
    assert wait_for(lambda: (state / "fired_0").exists(), 120), run.dump()
    time.sleep(0.5)
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 143, run.dump()
    assert "of the 6s grace period are over (the rest is kept for the agent-side save)" in run.stderr
    flash = re.search(r"flash save after the stop: committed step (\d+) from shared memory", run.stderr)
    assert flash and int(flash.group(1)) == 9, run.dump()  # the step before the hang
    resumed = rerun(tmp_path)
    assert "resumed from step 9" in resumed.stdout
    assert final_checksum(resumed.stdout) == reference[STEPS]


# 3 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("staged", [False, True], ids=["no-staging", "staged"])
def test_3_sigkill_of_a_worker_during_save(tmp_path: Path, reference: dict[int, str], staged: bool) -> None:
    """Slow storage for the save of step 11; rank 1 is SIGKILLed while it writes.

    The rank-side save never gets its marker. Without staging, the restart resumes from the
    previous checkpoint (step 7); with staging, mlaunch commits step 11 from shared memory.
    """
    job = write_job(tmp_path, restarts=1, args="" if staged else ", '--no-stage'")
    run = Run(job, CHAOS_SLOW_SAVE="11:3")
    partial = tmp_path / "ckpt" / "step_00000011.tmp"
    assert wait_for(lambda: (partial / "rank_0.mlck").exists() or (partial / "rank_2.mlck").exists(), 120), run.dump()
    time.sleep(0.3)  # every rank is inside the slow writer now
    os.kill(run.pids()[1], signal.SIGKILL)
    assert run.finish() == 0, run.dump()
    first_attempt = run.stderr.split("restarting the group")[0]
    assert "committed step 11 to" not in first_attempt  # the ranks' own save of 11 never committed
    if staged:
        assert "flash save after node 0 rank 1 failed: committed step 11" in run.stderr, run.dump()
        assert "resumed from step 11" in run.stdout
    else:
        assert "flash save" not in run.stderr
        assert "resumed from step 7" in run.stdout, run.dump()
    assert final_checksum(run.stdout) == reference[STEPS]


# 4 ----------------------------------------------------------------------------------------


def test_4_grace_period_shorter_than_the_save_commits_nothing(tmp_path: Path, reference: dict[int, str]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    job = write_job(tmp_path, grace="2s")
    # storage is slow for everyone: the ranks' dying save and mlaunch's own attempt to persist
    env = {"CHAOS_SLOW_DYING_SAVE": "6", **slow_storage_env(6)}
    run = Run(job, CHAOS_PLAN="0:9:term_launcher", CHAOS_STATE=str(state), **env)
    code = run.finish()
    assert code == 137, run.dump()  # the exit code says the dying checkpoint was cut off
    assert "of the 2s grace period are over" in run.stderr, run.dump()
    assert "flash save after the stop: the deadline passed before every shard was written" in run.stderr, run.dump()
    # the step before the cut-off save: 7 when mlaunch's SIGTERM lands at once; a loaded machine may let the
    # ranks run (and save every 4 steps) a little longer before it does
    fallback = re.search(r"it was NOT committed; a resume falls back to step (\d+)", run.stderr)
    assert fallback and int(fallback.group(1)) >= 7, run.dump()
    assert [c.step for c in layout.committed(tmp_path / "ckpt")][0] == int(fallback.group(1))
    resumed = rerun(tmp_path)
    assert f"resumed from step {fallback.group(1)}" in resumed.stdout
    assert final_checksum(resumed.stdout) == reference[STEPS]


# 5 ----------------------------------------------------------------------------------------


def test_5_disk_full_during_save(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ckpt", "1m") as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        job = write_job(tmp_path)
        run = Run(job, CHAOS_STEP_SLEEP="0.25")
        assert wait_for(lambda: layout.newest_step(mount) == 3, 120), run.dump()
        fill(mount)
        run.proc.send_signal(signal.SIGTERM)
        code = run.finish()
        assert code != 0, run.dump()
        assert "No space left on device" in run.stdout + run.stderr
        assert "while stopping; its dying checkpoint may not be committed" in run.stderr, run.dump()
        assert [c.step for c in layout.committed(mount)] == [3]  # previous checkpoint intact
        assert not layout.partial_dirs(mount)
        for filler in mount.glob("filler-*"):
            filler.unlink()
        newest = layout.committed(mount)[0]
        for rank in range(4):  # every rank's shard of step 3 still reads back
            state, meta = shardfile.read_file(newest.shard(rank))
            assert meta["step"] == 3 and state["step"] == 3


# 6 ----------------------------------------------------------------------------------------


def test_6_sigkill_of_mlaunch_leaves_no_process_and_no_shared_memory(tmp_path: Path) -> None:
    extra = "preload: [torch, torch.distributed, torch.nn.parallel, torch._dynamo, numpy, launchers.elastic]\n"
    job = write_job(tmp_path, steps=100000, restarts=2, extra=extra)
    run = Run(job, CHAOS_STEP_SLEEP="0.05")
    run.wait_step(3)
    assert wait_for(lambda: "warm standby workers ready" in run.stderr, 120), run.dump()
    kids = children(run.proc.pid)  # 4 workers, 4 standbys, the warm parent that forked them, the watchdog
    assert len(kids) == 10, kids
    run_id = run_id_of(run.pids()[0])
    assert run_id
    segments = list(Path("/dev/shm").glob(f"mlaunch.{run_id}.rank*"))
    assert len(segments) == 4
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait(timeout=30)
    assert wait_for(lambda: not any(alive(p) for p in kids), 20), [p for p in kids if alive(p)]
    assert wait_for(lambda: not list(Path("/dev/shm").glob(f"mlaunch.{run_id}.*")), 10)


# 7 ----------------------------------------------------------------------------------------


def test_7_double_sigterm_saves_once(tmp_path: Path) -> None:
    job = write_job(tmp_path, args=", '--save-every', '0'")
    run = Run(job, CHAOS_STEP_SLEEP="0.05")
    run.wait_step(6)
    pids = run.pids()
    run.proc.send_signal(signal.SIGTERM)
    for pid in pids.values():  # a platform that signals every process of the container, twice
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.02)
    run.proc.send_signal(signal.SIGTERM)
    for pid in pids.values():
        os.kill(pid, signal.SIGTERM)
    assert run.finish() == 143, run.dump()
    assert sum(1 for line in run.err if line.startswith("[node") and re.search(r"committed step \d+ to", line)) == 1
    assert sum(1 for line in run.err if line.startswith("[node") and "ignored (already stopping)" in line) >= 4
    committed = layout.committed(tmp_path / "ckpt")
    assert len(committed) == 1 and not layout.partial_dirs(tmp_path / "ckpt")
    assert json.loads((committed[0].path / layout.MARKER).read_text())["source"] == "save"


# 8 ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_8_ten_mixed_faults_end_bit_identical(tmp_path: Path, reference: dict[int, str]) -> None:
    rng = random.Random(8)
    kinds = ["kill9", "kill9", "kill9", "term", "term2", "term_launcher", "term_launcher", "kill9_in_save"]
    kinds += ["kill9_in_save", "term"]
    rng.shuffle(kinds)
    at = sorted(rng.sample(range(2, STEPS - 3), len(kinds)))
    plan = ";".join(f"{rng.randrange(4)}:{s}:{k}" for s, k in zip(at, kinds, strict=True))
    state = tmp_path / "state"
    state.mkdir()
    extra = "preload: [torch, torch.distributed, torch.nn.parallel, torch._dynamo, numpy, launchers.elastic]\n"
    write_job(tmp_path, restarts=10, extra=extra)
    outputs = []
    for _ in range(6):  # each term_launcher ends one mlaunch run; the next run resumes
        result = run_mlaunch(
            ["--engine", "pytorch", str(tmp_path / "job.yaml")],
            env=clean_env(CHAOS_PLAN=plan, CHAOS_STATE=str(state)),
            timeout=600,
        )
        outputs.append(result)
        if result.returncode == 0:
            break
        assert result.returncode == 143, result.stderr[-3000:]
    fired = sorted(state.glob("fired_*"))
    assert len(fired) == len(kinds), (plan, [f.read_text() for f in fired])
    assert outputs[-1].returncode == 0, outputs[-1].stderr[-3000:]
    assert final_checksum(outputs[-1].stdout) == reference[STEPS], plan
