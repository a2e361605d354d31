"""DeepSpeed ZeRO-3 under ``MlaunchDeepSpeed`` (issue 48): partitioned parameters lose nothing and resume exactly.

ZeRO-3 partitions the parameters themselves, so each rank's checkpoint is its own pair of files
(``zero_pp_rank_<r>_mp_rank_00_model_states.pt``: the module's state with every partitioned parameter an empty
placeholder, and ``..._optim_states.pt``: the flat fp32 partition and its Adam moments), and each rank loads its
own. Real DeepSpeed 0.19.8 on CPU (``DS_ACCELERATOR=cpu``, gloo), real mlaunch and signals; the job is a small
language model with tied embeddings and dropout written in torch (``tests/scripts/zero3_deepspeed.py``: no
transformers import, which cost each of four ranks ~25 s a start on 2 cores), the one-process file comparison a
transformers GPT-2 built from config. The pattern and checks are ``test_trainers._faults_lose_nothing``'s.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import needs_torch
from framework_venvs import trainers_python  # noqa: F401 - a fixture
from test_trainers import SAVES, SCRIPTS, _env, _faults_lose_nothing
from trainer_jobs import extensions_dir

pytestmark = [pytest.mark.slow, needs_torch]


def test_zero3_loses_no_step_on_kill_9_or_sigterm_and_ends_bit_identical(
    tmp_path: Path,
    trainers_python: Path,  # noqa: F811
) -> None:
    """2 × 2, ZeRO-3: kill -9 of rank 3 at a random step (mlaunch's staged step materialised as DeepSpeed's
    per-rank files), then SIGTERM of the restarted job (``save_checkpoint`` on every rank): 0 steps lost each
    time, and the resumed run ends with the gathered parameters (sha256) of its uninterrupted twin. Before:
    the materialised model states files carried the persistent parameters whole where DeepSpeed writes
    placeholders, and ranks above 0 found no RNG state of theirs in their own file (dropout diverged)."""
    script = SCRIPTS / "zero3_deepspeed.py"
    _faults_lose_nothing("deepspeed", trainers_python, tmp_path, step_time=0.3, procs_per_node=2, script=script)


def test_a_materialised_zero3_save_is_what_deepspeed_writes(tmp_path: Path, trainers_python: Path) -> None:  # noqa: F811
    """One process, ZeRO-3: the step staged and materialised is DeepSpeed's ``save_checkpoint`` of that step — the
    optimizer partition byte for byte (its ``ds_id`` tag kept), the model states file in values (placeholders
    for the partitioned parameters; pickle's memo of run-time strings differs) — the tie is recorded, and a
    pristine engine's ``load_checkpoint`` of it restores every parameter."""
    env = {
        **_env(),
        "DS_ACCELERATOR": "cpu",
        "TORCH_EXTENSIONS_DIR": str(extensions_dir(trainers_python)),
        "ZERO_STAGE": "3",
    }
    argv = [str(trainers_python), str(SAVES), "deepspeed", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    result = json.loads(lines[-1])
    assert "error" not in result, result["error"]
    assert result["files"] == {
        "zero_pp_rank_0_mp_rank_00_model_states.pt": "same values",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt": "same",
    }
    assert result["loads"] and result["tied"], result
