"""MindSpore: the ExceptionCheckpoint callback in real data-parallel training (slow: its own venv).

Two MindSpore workers and a scheduler (the ascend engine's msrun style, as
tests/test_mindspore_real.py runs them); one worker sends itself SIGTERM at step 5. Both must
stop at step 5, save their network with mindspore.save_checkpoint, rank 0 commits, both exit
143; the next run finds each rank's file with ``ExceptionCheckpoint.latest`` and loads it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, run_mlaunch
from framework_venvs import mindspore_python  # noqa: F401 - session fixture

from launchers.elastic.format import layout

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "tests" / "scripts" / "ms_exception_ckpt.py"


def job(tmp_path: Path, python: Path, extra_env: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: ms-exception-ckpt\nengine: ascend\nentry: {SCRIPT}\nnodes: 1\nprocs_per_node: 2\n"
        f"ascend: {{style: msrun}}\npython: {python}\nlog_dir: {tmp_path / 'logs'}\n"
        f"env: {{GLOG_v: '3', PYTHONPATH: {ROOT}, CKPT_DIR: {tmp_path / 'ckpt'}{extra_env}}}\n"
    )
    return path


def test_exception_checkpoint_saves_the_agreed_step_and_resumes(tmp_path: Path, mindspore_python: Path) -> None:  # noqa: F811
    stopped = run_mlaunch(
        [str(job(tmp_path, mindspore_python, ", SIGNAL_RANK: '1', SIGNAL_STEP: '5'"))], env=clean_env(), timeout=300
    )
    assert stopped.returncode == 143, stopped.stderr[-4000:]
    assert re.search(r"\[rank 1\] .*received SIGTERM", stopped.stderr)
    assert re.search(r"\[rank 0\] .*another rank was signalled; stopping at step 5", stopped.stderr)
    committed = layout.committed(tmp_path / "ckpt")
    assert [c.step for c in committed] == [5]
    assert sorted(p.name for p in committed[0].path.iterdir()) == [layout.MARKER, "rank_0.ckpt", "rank_1.ckpt"]
    resumed = run_mlaunch([str(job(tmp_path, mindspore_python))], env=clean_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert sorted(re.findall(r"\[rank (\d)\] resumed 5 from (rank_\d\.ckpt)", resumed.stdout)) == [
        ("0", "rank_0.ckpt"),
        ("1", "rank_1.ckpt"),
    ]
