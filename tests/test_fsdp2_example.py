"""examples/fsdp2 under mlaunch: FSDP2 state through mlaunch's checkpoints (issue 23, items 2, 3 and 6).

Real ranks (gloo, CPU, ``fully_shard``), the example's own job: 2 nodes × 2 processes simulated
on this machine, its state exactly as ``get_state_dict(model, optimizer)`` returns it.

- kill -9 of a rank: mlaunch's flash save commits the newest step every rank staged, restarts
  the job from it, and the run ends with the final parameters of an uninterrupted run;
- SIGTERM: the ranks save at the step boundary, the next run resumes it bit-identically;
- 4 → 2 → 4 ranks: each run resumes the previous one's checkpoint resharded, with the model
  equal to the one saved (its checksum over the gathered parameters, printed at the save and
  after the load).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, BackgroundMlaunch, needs_torch, run_mlaunch

pytestmark = [needs_torch, pytest.mark.slow]

STEPS = 30


def job(tmp: Path, ckpt: Path, *, nodes: int, args: str = "") -> Path:
    path = tmp / f"job-{nodes}-{len(list(tmp.glob('job-*')))}.yaml"
    path.write_text(
        f"name: fsdp2\nengine: pytorch\nentry: train.py\ncode_dir: {EXAMPLES / 'fsdp2'}\n"
        f"args: ['--steps', '{STEPS}', '--step-sleep', '0.1'{args}]\nnodes: {nodes}\nprocs_per_node: 2\n"
        f"env: {{GLOO_SOCKET_IFNAME: lo}}\nlog_dir: {tmp / 'logs'}\n"
        f"checkpoint: {{dir: {ckpt}, grace_period: 30s, keep: 3}}\nrestart: {{max_restarts: 1, backoff: 0s}}\n"
    )
    return path


def found(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in:\n{text}"
    return match.group(1)


def stopped_after(job_file: Path, step: int) -> tuple[int, str]:
    """Run ``job_file``; SIGTERM mlaunch once rank 0 finished ``step`` of this run. (saved step, model checksum)."""
    run = BackgroundMlaunch(["--engine", "pytorch", str(job_file)])
    deadline = time.monotonic() + 240
    while not re.search(rf"\bstep {step} loss", run.stdout) and run.proc.poll() is None:
        assert time.monotonic() < deadline, run.stdout
        time.sleep(0.05)
    run.proc.send_signal(signal.SIGTERM)
    err = run.wait(timeout=120)
    assert run.proc.returncode == 143, f"{run.stdout}\n{err}"
    saved = found(r"saved step (\d+): model-checksum", run.stdout)
    return int(saved), found(rf"saved step {saved}: model-checksum ([0-9a-f]+)", run.stdout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("fsdp2-reference")
    done = run_mlaunch(["--engine", "pytorch", str(job(tmp, tmp / "ckpt", nodes=2))])
    assert done.returncode == 0, done.stderr
    return found(r"final-checksum ([0-9a-f]+)", done.stdout)


def test_kill_9_of_a_rank_is_flash_saved_and_resumed_bit_identical(tmp_path: Path, reference: str) -> None:
    killed = job(tmp_path, tmp_path / "ckpt", nodes=2, args=", '--kill-rank-at', '3:8'")
    done = run_mlaunch(["--engine", "pytorch", str(killed)])
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert re.search(r"rank 3 \(pid \d+\) was killed by SIGKILL", done.stderr), done.stderr
    step = int(found(r"committed step (\d+) from shared memory", done.stderr))
    assert step >= 7, done.stderr  # rank 3 staged step 8 before dying; every rank staged at least step 7
    assert found(r"resumed from step (\d+) \(saved by 4 ranks, now 4\)", done.stdout) == str(step)
    assert found(r"final-checksum ([0-9a-f]+)", done.stdout) == reference
    # the README's kill -9, drawn (issue 46): the kill on rank 3's node, the restart, the resume, the flash save
    drawn = run_mlaunch(["timeline", str(killed), "-o", str(tmp_path / "timeline.png")])
    assert drawn.returncode == 0 and "(finished, 2 node(s), 1 fault(s))" in drawn.stdout, drawn.stdout + drawn.stderr
    from launchers.observe import timeline_model

    marks = {(m.kind, m.node) for m in timeline_model.load([tmp_path / "logs"]).marks}
    assert {("sigkill", 1), ("restart", None), ("resume", None), ("commit_flash", None)} <= marks, marks


def test_sigterm_saves_and_the_next_run_resumes_bit_identical(tmp_path: Path, reference: str) -> None:
    ckpt = tmp_path / "ckpt"
    step, saved = stopped_after(job(tmp_path, ckpt, nodes=2), 6)
    done = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, ckpt, nodes=2))])
    assert done.returncode == 0, done.stderr
    assert (
        found(rf"resumed from step {step} \(saved by 4 ranks, now 4\): model-checksum ([0-9a-f]+)", done.stdout)
        == saved
    )
    assert found(r"final-checksum ([0-9a-f]+)", done.stdout) == reference
    assert not list(ckpt.glob("step_*")), "a finished run clears its resume points"


def test_four_ranks_to_two_and_back_to_four_resume_the_saved_model(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    step4, saved4 = stopped_after(job(tmp_path, ckpt, nodes=2), 5)
    run2 = BackgroundMlaunch(["--engine", "pytorch", str(job(tmp_path, ckpt, nodes=1))])
    while not re.search(rf"\bstep {step4 + 4} loss", run2.stdout) and run2.proc.poll() is None:
        time.sleep(0.05)
    pattern = rf"resumed from step {step4} \(saved by 4 ranks, now 2\): model-checksum ([0-9a-f]+)"
    assert found(pattern, run2.stdout) == saved4
    run2.proc.send_signal(signal.SIGTERM)
    err = run2.wait(timeout=120)
    assert run2.proc.returncode == 143, err
    step2 = int(found(r"saved step (\d+): model-checksum", run2.stdout))
    saved2 = found(rf"saved step {step2}: model-checksum ([0-9a-f]+)", run2.stdout)
    assert step2 > step4
    done = run_mlaunch(["--engine", "pytorch", str(job(tmp_path, ckpt, nodes=2))])
    assert done.returncode == 0, done.stderr
    pattern = rf"resumed from step {step2} \(saved by 2 ranks, now 4\): model-checksum ([0-9a-f]+)"
    assert found(pattern, done.stdout) == saved2
    assert found(r"final-checksum ([0-9a-f]+)", done.stdout)
