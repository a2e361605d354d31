"""The flash save's commit runs beside an in-place recovery (issue 44): the re-formed group never waits for the disk.

Real mlaunch, real ranks (1 node × 4, DDP over gloo, CPU, ``tests/scripts/in_place_ddp.py``), a real kill -9 of
rank 2 at step 15. The commit is made slow for real, not mocked: the checkpoint directory is a filesystem of its own
(an ext4 image, loop-mounted) frozen with ``fsfreeze`` before the job starts, so every write of the commit blocks in
the kernel until the test thaws it, as a commit to stalled storage does. Needs root (mount, fsfreeze): skipped with
the reason elsewhere. What a user relies on:

- the re-formed group resumes from the step every rank staged and trains to the end while that step cannot even
  be written (the survivors keep their processes; every rank reads it from the memory the recovery kept);
- the memory the commit reads (the kept segments) stays until the commit has read it: mlaunch keeps it, and
  does not exit, while the commit waits;
- once the storage moves again the step is committed whole (marker last, renamed), with the state of that step,
  and nothing is left in shared memory.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch
from loop_storage import loop_mounted

from launchers.elastic.format import layout, shardfile

pytestmark = [needs_torch, pytest.mark.slow]

SCRIPT = ROOT / "tests" / "scripts" / "in_place_ddp.py"
STEPS, AT = 30, 15


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Path]:
    """An ext4 filesystem of its own for the checkpoints (``loop_storage``), thawed and unmounted at the end."""
    with loop_mounted(tmp_path, 64) as mount:
        yield mount


def steps_of(log: Path, rank: int) -> list[tuple[int, int, float]]:
    """(pid, step, time) of each step rank ``rank`` trained."""
    path = log / f"rank{rank}"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        pid, step, stamp = line.split()
        found.append((int(pid), int(step), float(stamp)))
    return found


class Job:
    """The job under mlaunch (``Popen``), its ranks' step logs, its shared memory and its output."""

    def __init__(self, tmp: Path, storage: Path, at: str) -> None:
        self.log, self.shm, self.storage = tmp / "steps", tmp / "shm", storage
        self.log.mkdir()
        self.shm.mkdir()
        job = tmp / "job.yaml"
        job.write_text(
            f"name: beside\nentry: {SCRIPT}\nargs: [--fault, kill, --steps, '{STEPS}', --at, '{at}', --keep]\n"
            f"engine: pytorch\nnodes: 1\nprocs_per_node: 4\nlog_dir: {tmp / 'logs'}\n"
            f"env: {{IN_PLACE_LOG: {self.log}}}\ncheckpoint: {{dir: {storage}, grace_period: 120s}}\n"
            "restart: {max_restarts: 3}\npreload: [torch]\n"
        )
        self.err = open(tmp / "err", "w+")  # noqa: SIM115 - read by ``stderr``, closed with the test's tmp dir
        self.out = open(tmp / "out", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
            env={**clean_env(), "MLAUNCH_SHM_DIR": str(self.shm)},
            cwd=ROOT,
            stdout=self.out,
            stderr=self.err,
        )

    def trained(self) -> dict[int, list[tuple[int, int, float]]]:
        return {r: steps_of(self.log, r) for r in range(4)}

    def until(self, done: Callable[[], bool], within: float = 180.0) -> None:
        end = time.monotonic() + within
        while time.monotonic() < end and self.proc.poll() is None and not done():
            time.sleep(0.2)

    def finished_training(self) -> bool:
        return all(any(step == STEPS - 1 for _, step, _ in steps) for steps in self.trained().values())

    def stderr(self, size: int = 3000) -> str:
        self.err.seek(0)
        return self.err.read()[-size:]

    def thaw_and_wait(self) -> int:
        subprocess.run(["fsfreeze", "--unfreeze", str(self.storage)], check=True)
        return self.proc.wait(120)

    def stop(self) -> None:
        subprocess.run(["fsfreeze", "--unfreeze", str(self.storage)], capture_output=True)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def processes(trained: dict[int, list[tuple[int, int, float]]]) -> dict[int, list[int]]:
    """Each rank's processes in the order they trained."""
    return {r: list(dict.fromkeys(pid for pid, _, _ in steps)) for r, steps in trained.items()}


def test_the_reformed_group_trains_while_its_step_is_committed_beside_it(tmp_path: Path, storage: Path) -> None:
    subprocess.run(["fsfreeze", "--freeze", str(storage)], check=True)
    job = Job(tmp_path, storage, str(AT))
    try:
        job.until(job.finished_training)
        trained = job.trained()
        # every rank trained to the end while nothing could be written to the checkpoint directory
        assert job.finished_training(), (trained, job.stderr())
        assert not layout.committed(storage)
        time.sleep(0.5)
        # mlaunch waits for the commit before it releases the memory the commit reads, and before it exits
        assert job.proc.poll() is None, job.stderr()
        kept = sorted(p.name.rsplit(".", 1)[1] for p in job.shm.glob("mlaunch.*.kept.rank*"))
        assert kept == [f"rank{r}" for r in range(4)], (kept, sorted(p.name for p in job.shm.iterdir()))
        code = job.thaw_and_wait()
    finally:
        job.stop()
    stderr = job.stderr(100_000)
    assert code == 0, stderr[-3000:]
    pids = processes(trained)
    assert [len(pids[r]) for r in range(4)] == [1, 1, 2, 1], (pids, stderr[-6000:])  # only rank 2's process is new
    assert [s for p, s, _ in trained[2] if p == pids[2][1]][0] == AT  # the group resumed right after step 14
    assert (
        re.findall(r"^\[rank \d\] .*step (\d+) read from the memory the in-place recovery kept", stderr, re.M)
        == [str(AT - 1)] * 4
    )
    assert f"beside the recovery: committed step {AT - 1}" in stderr, stderr[-3000:]
    (item,) = layout.committed(storage)  # the step, committed whole, under its final name
    assert item.step == AT - 1 and item.path.name == layout.step_name(AT - 1) and item.world_size == 4
    assert item.time > max(stamp for r in range(4) for _, _, stamp in trained[r])  # after the group's last step
    for rank in range(4):
        state, _ = shardfile.read_file(item.shard(rank))
        assert state["step"] == AT - 1
    assert not list(job.shm.iterdir()), sorted(p.name for p in job.shm.iterdir())  # nothing outlives the run


def test_a_second_fault_during_the_commit_loses_nothing(tmp_path: Path, storage: Path) -> None:
    """Rank 2 is killed at step 15, then again at step 20 while step 14's commit is stalled: the second flash
    save waits for the first commit (commits stay in order), then both steps are committed whole and the group
    resumes after step 19, read from memory; no rank skips a step."""
    subprocess.run(["fsfreeze", "--freeze", str(storage)], check=True)
    job = Job(tmp_path, storage, f"{AT},{AT + 5}")
    try:
        job.until(lambda: (job.log / f"fault-done-{AT + 5}").exists())
        assert (job.log / f"fault-done-{AT + 5}").exists(), job.stderr()
        time.sleep(1.0)
        assert job.proc.poll() is None and not layout.committed(storage), job.stderr()
        assert "waiting for the flash save's commit of step 14 beside the recovery" in job.stderr()
        code = job.thaw_and_wait()
    finally:
        job.stop()
    stderr = job.stderr(100_000)
    assert code == 0, stderr[-3000:]
    trained = job.trained()
    assert [len(p) for p in processes(trained).values()] == [1, 1, 3, 1], (processes(trained), stderr[-6000:])
    for rank in range(4):
        steps = [s for _, s, _ in trained[rank]]
        assert sorted(set(steps)) == list(range(STEPS)), (rank, steps)  # every step, none skipped
    assert re.findall(r"^\[rank \d\] .*step (\d+) read from the memory the in-place recovery kept", stderr, re.M) == (
        [str(AT - 1)] * 4 + [str(AT + 4)] * 4
    ), stderr[-3000:]
    assert sorted(i.step for i in layout.committed(storage)) == [AT - 1, AT + 4], stderr[-3000:]
    for item in layout.committed(storage):
        for rank in range(4):
            state, _ = shardfile.read_file(item.shard(rank))
            assert state["step"] == item.step
    assert not list(job.shm.iterdir()), sorted(p.name for p in job.shm.iterdir())
