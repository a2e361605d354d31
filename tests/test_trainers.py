"""Bring your trainer: HF ``Trainer``, Lightning, Accelerate, DeepSpeed lose nothing on kill -9 or SIGTERM.

Each test runs the framework's example (``examples/<framework>/train.py``: the one-line integration,
the framework's own resume path) as a job of 2 nodes on CPU, three times:

1. uninterrupted, for the reference ``final-checksum`` (sha256 of every parameter);
2. faulted: kill -9 of the last rank at a random step (mlaunch flash-saves the newest step every rank staged
   and restarts the job, which the framework resumes natively), then SIGTERM to mlaunch at a random
   step of the restarted job (every rank stops at one agreed step, saved in the framework's format;
   mlaunch exits 143 — with Lightning this is the deadlock case without the callback);
3. run again: it resumes and finishes.

Checked: each fault loses 0 steps (the newest step every rank finished before it minus the step
training begins from afterwards; a rank killed after staging a step but before printing it makes that
figure -1), the SIGTERM ends within the grace period without mlaunch's SIGKILL,
and the resumed run ends with the reference checksum. Real mlaunch, real frameworks (transformers
5.24, accelerate 1.15 and deepspeed 0.19.8 from the cached trainers venv, lightning 2.6 from the test
extra; DeepSpeed on CPU with ``DS_ACCELERATOR=cpu``, ZeRO stage 2), gloo, real signals. The Accelerate
and DeepSpeed examples sleep 0.3 s a step: their steps take milliseconds, and the job would otherwise
finish before the SIGTERM reaches it.

HF ``Trainer`` runs 2 × 2 (several ranks per node: local ranks above 0, one node's flash
save of two ranks); Lightning, Accelerate and DeepSpeed run 2 × 1 — the same faults, restarts and resumes across
nodes at half the processes, since on CI's 2 cores four ranks importing a framework double every
start-up. ``benchmarks/trainers.py`` measures all four as 2 × 2.

Issue 48 ("exact means exact") adds, 2 × 2 each: Lightning and Accelerate as their docs write a loop (a
tied-embedding GPT-2 from config, a plain shuffled ``DataLoader``: ``tests/scripts/plain_*.py``), and DDP staging
its module's own ``state_dict()`` (``tests/scripts/ddp_state_dict.py``) — each ending bit-identical to its
uninterrupted run; the cause of DDP's difference, reproduced (``tests/scripts/ddp_first_step.py``); and, per
framework, a materialised flash save compared with the framework's own save of the same step
(``tests/scripts/framework_saves.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import needs_torch
from framework_venvs import trainers_python  # noqa: F401 - a fixture
from trainer_faults import SAVES, SCRIPTS, faults_lose_nothing, trainer_env
from trainer_jobs import extensions_dir

pytestmark = [pytest.mark.slow, needs_torch]


def test_hf_trainer_loses_no_step_on_kill_9_or_sigterm(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    faults_lose_nothing("transformers", trainers_python, tmp_path, procs_per_node=2)


def test_lightning_loses_no_step_on_kill_9_or_sigterm(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    # 2 × 1: where a rank once hung in its exit after the agreed stop (gloo's group destructed under the GIL
    # while its worker thread needed it; see guard.end_process_groups) — this test is what caught it
    faults_lose_nothing("lightning", trainers_python, tmp_path)


def test_lightning_plain_shuffled_loader_resumes_bit_identical(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    """2 × 2, a tied GPT-2 from config fed by ``DataLoader(shuffle=True)`` (Lightning injects its
    ``DistributedSampler``), the one line ``MlaunchCallback``: kill -9 then SIGTERM mid-epoch, in later epochs
    (5 batches an epoch), and the run ends bit-identical to its uninterrupted twin. Without the callback's
    data resume Lightning restarted each epoch from its first batch (lost 0 steps, ended elsewhere).

    The faults are fixed at epochs' ends: kill -9 at step 5 (the last batch of epoch 0: the flash save restores
    at an epoch's end), SIGTERM 4 steps after the restart (the stop at step 10, epoch 1's last batch). Drawn at
    random, this pair came up once in CI and ended elsewhere: Lightning's resume from a last batch left its
    epoch counters one short, so the second resume ran epoch 2 in epoch 1's order
    (``count_the_epoch_resumed_into``). Mid-epoch stops: the next test and ``TRAINER_FAULTS=7,3``."""
    script = SCRIPTS / "plain_lightning.py"
    faults_lose_nothing(
        "lightning", trainers_python, tmp_path, step_time=0.2, procs_per_node=2, script=script, faults=(5, 4)
    )


def test_lightning_resumes_exactly_at_and_between_epoch_ends(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    """One process, no mlaunch (``tests/scripts/lightning_epoch_ends.py``: 5 batches an epoch, stopped where
    mlaunch's SIGTERM stop saves): stopped mid-epoch (7), at an epoch's end from mid-epoch (10), at the next
    epoch's end from an epoch's end (15), then run to step 24, the run ends bit-identical to its uninterrupted
    twin. Without ``count_the_epoch_resumed_into`` the resume from step 15 ran epoch 3 in epoch 2's order."""
    import subprocess

    def run(output: Path, stop_at: int = 0) -> str:
        argv = [str(trainers_python), str(SCRIPTS / "lightning_epoch_ends.py"), "--output", str(output)]
        proc = subprocess.run(
            [*argv, "--stop-at", str(stop_at)], env=trainer_env(), capture_output=True, text=True, timeout=300
        )
        said = proc.stdout + proc.stderr
        assert proc.returncode == 0, said
        if stop_at:
            assert f"stopped at step {stop_at}" in said, said
            return ""
        sums = [line.split()[-1] for line in said.splitlines() if line.startswith("final-checksum ")]
        assert len(sums) == 1, said
        return sums[0]

    expected = run(tmp_path / "uninterrupted")
    for stop_at in (7, 10, 15):
        run(tmp_path / "stopped", stop_at)
    assert run(tmp_path / "stopped") == expected


def test_ddp_resume_differs_by_the_bucket_layout_alone(tmp_path: Path) -> None:
    """The cause, reproduced (3 ranks, gloo): the state a resumed DDP loads equals the saved one bit for bit, its
    run ends in other bits than the uninterrupted one, and the same resume ends bit-identical once the fresh DDP
    is given the bucket layout the old one had rebuilt after its first iteration."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "ddp_first_step.py"), "3"],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    got = json.loads(lines[-1])
    assert got["constructor_layout"] != got["rebuilt_layout"], got
    assert got["loaded_exact"], got
    assert got["resumed"] != got["uninterrupted"], got
    assert got["resumed_with_layout"] == got["uninterrupted"], got


def test_ddp_staging_its_module_state_dict_resumes_bit_identical(tmp_path: Path) -> None:
    """2 × 2 (more than two ranks: the bucket layout decides gloo's summation order), a DDP script that stages
    ``model.module.state_dict()`` (never the DDP wrapper): kill -9 then SIGTERM, and the run ends bit-identical
    to its uninterrupted twin. Without ``ddp_layouts`` the restarted DDP's first step reduced with the
    constructor's bucket layout and the run ended elsewhere (``tests/scripts/ddp_first_step.py``)."""
    import sys

    script = SCRIPTS / "ddp_state_dict.py"
    faults_lose_nothing("ddp", Path(sys.executable), tmp_path, step_time=0.2, procs_per_node=2, script=script)


@pytest.mark.parametrize(("data", "says"), [("iterable", "IterableDataset"), ("random", "RandomSampler")])
def test_lightning_says_once_when_the_data_cannot_resume_exactly(data: str, says: str) -> None:
    """An ``IterableDataset`` without state, or a ``RandomSampler`` in one process: ``MlaunchCallback`` cannot
    resume the data mid-epoch exactly and says so once, at the start of training (nothing silent)."""
    import subprocess
    import sys

    argv = [sys.executable, str(SCRIPTS / "lightning_inexact.py"), data]
    proc = subprocess.run(argv, env=trainer_env(), capture_output=True, text=True, timeout=300)
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "MlaunchCallback:" in line]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(said) == 1 and says in said[0], said


def test_accelerate_loses_no_step_on_kill_9_or_sigterm(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    faults_lose_nothing("accelerate", trainers_python, tmp_path, step_time=0.3)


def test_accelerate_tied_gpt2_plain_loader_resumes_bit_identical(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    """2 × 2, a tied GPT-2 from config, a plain shuffled ``DataLoader`` through ``accelerator.prepare`` and
    ``skip_first_batches`` on resume: kill -9 then SIGTERM, bit-identical to the uninterrupted run. The kill -9
    used to end the job: every restarted rank failed in ``load_state`` on the tied weight."""
    script = SCRIPTS / "plain_accelerate.py"
    faults_lose_nothing("accelerate", trainers_python, tmp_path, step_time=0.3, procs_per_node=2, script=script)


# Issue 44: each framework's extra arguments and step time (DeepSpeed's and Accelerate's steps take milliseconds)
RECOVERABLE = {"accelerate": ("0.1",), "transformers": ("0.1",), "deepspeed": ("0.1", "--zero", "2")}


@pytest.mark.parametrize("framework", list(RECOVERABLE))
def test_trainers_under_recoverable_keep_the_surviving_rank(
    framework: str,
    tmp_path: Path,
    trainers_python: Path,  # noqa: F811
) -> None:
    """Issue 44: the framework example's ``main`` under ``@elastic.recoverable`` (``tests/scripts/
    recoverable_example.py``), 2 × 1: rank 1 killed at step 8; rank 0 keeps its process and calls ``main``
    again (a new ``Accelerator``, ``Trainer`` or DeepSpeed engine, after mlaunch forgot the framework's
    process-wide state), rank 1 is a new process, nothing is lost and the run ends bit-identical to its
    uninterrupted twin. Without the forgetting, Accelerate's second ``Accelerator()`` took the old state as
    initialised and never made the new group: the survivor's call failed in DDP ("Default process group has
    not been initialized") and the job never finished."""
    from trainer_jobs import Run, job_yaml

    script = SCRIPTS / "recoverable_example.py"
    step_time, *extra = RECOVERABLE[framework]
    args = [framework, "--steps", "24", "--save-every", "10", "--step-time", step_time, *extra]
    env = trainer_env()

    def job(name: str) -> Path:
        workdir = tmp_path / name
        workdir.mkdir()
        return job_yaml(workdir, framework, trainers_python, args, restarts=2, procs_per_node=1, script=script)

    reference = Run(job("uninterrupted"), env, world=2)
    assert reference.wait() == 0, reference.tail()
    run = Run(job("faulted"), env, world=2)
    try:
        run.wait_step(8, attempt=0)
        run.kill_rank(1, attempt=0)
        assert run.wait() == 0, run.tail()
    finally:
        run.close()
    everything = "\n".join(run.lines)
    assert "keep their processes and rejoin in place" in everything, run.tail()
    first, second = run.attempts[0], run.attempts[1]
    assert second.pids[0] == first.pids[0] and second.pids[1] != first.pids[1], (first.pids, second.pids)
    assert second.start[0] >= first.all_finished(), run.tail()  # from memory: no step every rank finished is lost
    assert run.checksum() == reference.checksum() is not None, run.tail()


def test_deepspeed_loses_no_step_on_kill_9_or_sigterm(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    # ZeRO stage 2 (each rank's optimizer partition in its own file); stages 0 and 1 write a subset of those files
    faults_lose_nothing("deepspeed", trainers_python, tmp_path, step_time=0.3, extra=("--zero", "2"))


# pickle writes a string once where the same object recurs: the materialised copy's strings are interned (as
# the names a framework's code writes are), while DeepSpeed builds its param_shapes names at run time; that
# file then holds the same values and structure (checked) in other bytes
SAME_VALUES = {"deepspeed": {"mp_rank_00_model_states.pt"}}


@pytest.mark.parametrize("framework", ["accelerate", "transformers", "lightning", "deepspeed"])
def test_a_materialised_flash_save_is_what_the_framework_writes(
    framework: str,
    tmp_path: Path,
    trainers_python: Path,  # noqa: F811
) -> None:
    """A tied-embedding GPT-2 (from config): the step mlaunch stages and materialises after a kill -9 is, file
    for file and byte for byte, the checkpoint the framework's own save writes of that step (DeepSpeed ZeRO-2:
    its model states file in values, see ``SAME_VALUES``), the tie is kept, and the framework's own load takes it
    (Accelerate's ``load_state`` refused a file holding both tied names)."""
    import json
    import subprocess

    env = {**trainer_env(), "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(extensions_dir(trainers_python))}
    proc = subprocess.run(
        [str(trainers_python), str(SAVES), framework, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    result = json.loads(lines[-1])
    assert "error" not in result, result["error"]
    expected = {name: "same values" if name in SAME_VALUES.get(framework, ()) else "same" for name in result["files"]}
    assert result["files"] and result["files"] == expected
    assert result["loads"] and result["tied"], result
