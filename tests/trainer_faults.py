"""A trainer job faulted the way every trainer test faults it: kill -9 of a rank, then SIGTERM, then a resume.

Shared by ``tests/test_trainers.py`` and ``tests/test_trainers_zero3.py`` (the procedure is described in
the first one's docstring); ``trainer_jobs`` runs the jobs and reads their lines.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

from conftest import clean_env
from trainer_jobs import Run, job_yaml, steps_lost

STEPS, SAVE_EVERY = 24, 10
# What each framework's ranks import first: a warm parent per node imports it once and forks the ranks (CI's time)
PRELOAD = {
    "transformers": ("torch", "transformers", "accelerate"),
    "lightning": ("torch", "lightning"),
    "accelerate": ("torch", "accelerate"),
    "ddp": ("torch", "torch.distributed", "torch.nn.parallel"),
    "deepspeed": ("torch", "deepspeed"),  # its import starts no thread (DS_ACCELERATOR=cpu, OMP_NUM_THREADS=1)
}
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def trainer_env() -> dict[str, str]:
    import os

    env = clean_env(PYTHONUNBUFFERED="1")
    root = str(Path(__file__).resolve().parent.parent)  # the ranks import this tree's launchers
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _faults_from_env() -> tuple[int, int] | None:
    """``TRAINER_FAULTS=5,4``: a failure's faults again (its message names them), over a test's own."""
    import os

    given = os.environ.get("TRAINER_FAULTS")
    if not given:
        return None
    kill_at, term_after = (int(part) for part in given.split(","))
    return kill_at, term_after


def faults_lose_nothing(
    framework: str,
    python: Path,
    tmp_path: Path,
    step_time: float = 0.0,
    extra: tuple[str, ...] = (),
    procs_per_node: int = 1,
    script: Path | None = None,
    faults: tuple[int, int] | None = None,
) -> None:
    world = 2 * procs_per_node
    rng = random.Random()
    kill_at, term_after = _faults_from_env() or faults or (rng.randint(3, SAVE_EVERY - 2), rng.randint(3, 7))
    # step_time: a job whose steps take milliseconds would finish before the SIGTERM reaches it
    args = ["--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--step-time", str(step_time), *extra]
    env = trainer_env()

    def job(workdir: Path, restarts: int) -> Path:
        preload = PRELOAD.get(framework, ())
        return job_yaml(
            workdir, framework, python, args, restarts=restarts, procs_per_node=procs_per_node, script=script,
            preload=preload,
        )  # fmt: skip

    base = tmp_path / "uninterrupted"
    base.mkdir()
    reference = Run(job(base, 0), env, world)
    assert reference.wait() == 0, reference.tail()
    assert not any("restarting the group" in line for line in reference.lines), reference.tail()  # uninterrupted
    expected = reference.checksum()
    assert expected, reference.tail()

    work = tmp_path / "faulted"
    work.mkdir()
    run = Run(job(work, 1), env, world)
    try:
        run.wait_step(kill_at, attempt=0)
        run.kill_rank(world - 1, attempt=0, sig=signal.SIGKILL)  # the last rank: on node 1
        restarted_from = run.wait_start(1)
        run.wait_step(restarted_from + term_after, attempt=1)
        run.terminate()
        code = run.wait()
    finally:
        run.close()
    where = f"(kill -9 at step {kill_at}, SIGTERM {term_after} steps after the restart)\n{run.tail()}"
    # ≤ 0: a rank killed between staging a step and printing it finished a step the output does not show
    assert steps_lost(run.attempts[0], restarted_from) <= 0, f"kill -9 lost steps {where}"
    # + 1: each rank stages a step (the integration's callback) before the example prints it, and kill -9 or
    # the SIGKILL after the flash save can land between the two on every rank: the resume is then one step past
    # every printed line, and the checksum at the end says whether that step was really finished
    newest_printed = max(run.attempts[0].steps.values())
    assert restarted_from <= newest_printed + 1, f"resumed past every rank {where}"
    assert code == 143, where
    assert not any("SIGKILL to" in line and "grace period" in line for line in run.lines), f"SIGTERM hung {where}"

    resumed = Run(job(work, 0), env, world)
    resumed_from = resumed.wait_start(0)
    assert resumed.wait() == 0, resumed.tail()
    assert not any("restarting the group" in line for line in resumed.lines), resumed.tail()  # one attempt
    assert steps_lost(run.attempts[1], resumed_from) == 0, f"SIGTERM lost steps {where}\n{resumed.tail()}"
    assert resumed.checksum() == expected, f"the resumed run ends elsewhere {where}\n{resumed.tail()}"


SAVES = SCRIPTS / "framework_saves.py"
