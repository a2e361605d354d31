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

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch

from launchers.elastic.format import layout, shardfile

pytestmark = [needs_torch, pytest.mark.slow]

SCRIPT = ROOT / "tests" / "scripts" / "in_place_ddp.py"
STEPS, AT = 30, 15


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Path]:
    """An ext4 filesystem of its own for the checkpoints (loop-mounted image), thawed and unmounted at the end."""
    if os.geteuid() != 0 or not (shutil.which("fsfreeze") and shutil.which("mkfs.ext4")):
        pytest.skip("needs root, fsfreeze and mkfs.ext4 (a filesystem to freeze under the commit)")
    image, mount = tmp_path / "ckpt.img", tmp_path / "ckpt"
    mount.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot loop-mount a filesystem here: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["fsfreeze", "--unfreeze", str(mount)], capture_output=True)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


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


def test_the_reformed_group_trains_while_its_step_is_committed_beside_it(tmp_path: Path, storage: Path) -> None:
    log, shm = tmp_path / "steps", tmp_path / "shm"
    log.mkdir()
    shm.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: beside\nentry: {SCRIPT}\nargs: [--fault, kill, --steps, '{STEPS}', --at, '{AT}', --keep]\n"
        f"engine: pytorch\nnodes: 1\nprocs_per_node: 4\nlog_dir: {tmp_path / 'logs'}\n"
        f"env: {{IN_PLACE_LOG: {log}}}\ncheckpoint: {{dir: {storage}, grace_period: 120s}}\n"
        "restart: {max_restarts: 3}\npreload: [torch]\n"
    )
    subprocess.run(["fsfreeze", "--freeze", str(storage)], check=True)
    out, err = open(tmp_path / "out", "w+"), open(tmp_path / "err", "w+")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [*mlaunch_cmd(), "--engine", "pytorch", str(job)],
        env={**clean_env(), "MLAUNCH_SHM_DIR": str(shm)},
        cwd=ROOT,
        stdout=out,
        stderr=err,
    )
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end and proc.poll() is None:
            if all(any(step == STEPS - 1 for _, step, _ in steps_of(log, r)) for r in range(4)):
                break
            time.sleep(0.2)
        trained = {r: steps_of(log, r) for r in range(4)}
        # every rank trained to the end while nothing could be written to the checkpoint directory
        assert all(trained[r] and trained[r][-1][1] == STEPS - 1 for r in range(4)), (trained, _tail(err))
        assert not layout.committed(storage)
        time.sleep(0.5)
        # mlaunch waits for the commit before it releases the memory the commit reads, and before it exits
        assert proc.poll() is None, _tail(err)
        kept = sorted(p.name.rsplit(".", 1)[1] for p in shm.glob("mlaunch.*.kept.rank*"))
        assert kept == [f"rank{r}" for r in range(4)], (kept, sorted(p.name for p in shm.iterdir()))
        subprocess.run(["fsfreeze", "--unfreeze", str(storage)], check=True)
        code = proc.wait(120)
    finally:
        subprocess.run(["fsfreeze", "--unfreeze", str(storage)], capture_output=True)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    stderr = _tail(err, 100_000)
    assert code == 0, stderr[-3000:]
    pids = {r: sorted({pid for pid, _, _ in trained[r]}, key=[p for p, _, _ in trained[r]].index) for r in range(4)}
    assert [len(pids[r]) for r in range(4)] == [1, 1, 2, 1], pids  # only rank 2's process is new
    assert [s for p, s, _ in trained[2] if p == pids[2][1]][0] == AT  # the group resumed right after step 14
    assert re.findall(r"step (\d+) read from the memory the in-place recovery kept", stderr) == [str(AT - 1)] * 4
    assert f"beside the recovery: committed step {AT - 1}" in stderr, stderr[-3000:]
    (item,) = layout.committed(storage)  # the step, committed whole, under its final name
    assert item.step == AT - 1 and item.path.name == layout.step_name(AT - 1) and item.world_size == 4
    assert item.time > max(stamp for r in range(4) for _, _, stamp in trained[r])  # after the group's last step
    for rank in range(4):
        state, _ = shardfile.read_file(item.shard(rank))
        assert state["step"] == AT - 1
    assert not list(shm.iterdir()), sorted(p.name for p in shm.iterdir())  # nothing outlives the run


def _tail(fh: object, size: int = 3000) -> str:
    fh.seek(0)  # type: ignore[attr-defined]
    return str(fh.read())[-size:]  # type: ignore[attr-defined]
