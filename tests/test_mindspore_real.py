"""Real MindSpore (2.10.0 with numpy<2, in its own venv) through the ascend engine's msrun style.

A scheduler (MS_ROLE=MS_SCHED) and 2 data-parallel workers, locally simulated: exit 0, the
all-reduce adds up, and both workers end with the same weights. The scheduler is a required
process that exits by itself once the workers finish, so mlaunch never has to stop it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import EXAMPLES, clean_env, run_mlaunch
from framework_venvs import mindspore_python  # noqa: F401 - session fixture

pytestmark = pytest.mark.slow


def test_msrun_two_workers_data_parallel(tmp_path: Path, mindspore_python: Path) -> None:  # noqa: F811
    text = (EXAMPLES / "mindspore" / "job.yaml").read_text()
    job = tmp_path / "job.yaml"
    job.write_text(
        f"{text}\npython: {mindspore_python}\ncode_dir: {EXAMPLES / 'mindspore'}\nlog_dir: {tmp_path / 'logs'}\n"
    )
    result = run_mlaunch([str(job)], env=clean_env(), timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    weights = re.findall(r"\[rank (\d)\] final-weights (\w+) (\[.*\])", result.stdout)
    assert sorted(w[0] for w in weights) == ["0", "1"], out[-4000:]
    assert weights[0][1:] == weights[1][1:]
    assert result.stdout.count("allreduce sum 3") == 2
    assert "job finished: all 3 processes exited 0" in result.stderr
    assert "stopping" not in result.stderr  # the scheduler ended on its own
    assert (tmp_path / "logs" / "scheduler.log").exists()
