"""Kill during save, 50 trials (MLAUNCH_KILL_TRIALS for more): SIGKILL a saving rank inside ``save()``.

Each trial starts a rank that resumes from the newest committed step (and checks what it
loaded), saves one step to completion, checks that no partial directory is left, then starts
saving the next step and is SIGKILLed at a random moment inside that save (uniform over
0.8 × the median duration of a full save; the process start-up and pipe latency shift some past the commit). Afterwards:
never a partial checkpoint loaded, the previous committed step always intact, and no stale
temporary directory after the next successful save.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

from launchers.elastic import Checkpointer
from launchers.elastic.format import layout

VICTIM = ROOT / "tests" / "scripts" / "save_victim.py"
TRIALS = int(os.environ.get("MLAUNCH_KILL_TRIALS", "50"))  # more: MLAUNCH_KILL_TRIALS=500
SIZE = 1 << 19  # int64 elements: a 4 MiB shard
pytest.importorskip("numpy")


def expect(proc: subprocess.Popen[str], prefix: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(prefix), (
        f"expected {prefix!r}, got {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
    )
    return line.split(maxsplit=1)[1].strip() if " " in line.strip() else ""


@pytest.mark.slow
def test_sigkill_at_random_offsets_inside_save_never_loses_the_committed_step(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("MLAUNCH_KILL_SEED", "14")))
    root = tmp_path / "ckpt"
    committed, durations, after_commit = -1, [0.05], 0
    for trial in range(TRIALS):
        # the newest committed step on disk: the one the last trial finished, or the one it was killed in (read
        # before the victim starts: a victim the test reads late has already saved the next steps; CI r77)
        on_disk = str(layout.newest_step(root) if trial else "none")
        proc = subprocess.Popen(
            [sys.executable, str(VICTIM), str(root), str(SIZE)],
            env=clean_env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            resumed = expect(proc, "resumed")
            assert resumed == on_disk, (trial, resumed, committed)
            step = int(resumed) if resumed != "none" else -1
            saved, seconds = expect(proc, "saved").split()
            assert int(saved) == step + 1
            durations.append(float(seconds))
            dirs = expect(proc, "clean").split()
            assert dirs and all(not name.endswith(".tmp") for name in dirs), dirs  # no stale partial save
            expect(proc, "saving")
            limit = sorted(durations)[len(durations) // 2] * 0.8
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=rng.uniform(0, limit))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        newest = layout.newest_step(root)
        assert newest in (step + 1, step + 2), (trial, newest, step)  # step + 1 is intact
        after_commit += newest == step + 2
        committed = step + 1
    state = Checkpointer(root).load_latest()
    assert state is not None and (state["w"] == state["step"]).all()
    median = sorted(durations)[len(durations) // 2]
    print(f"{TRIALS} kills; {after_commit} landed after the commit; median save {median:.3f}s")
