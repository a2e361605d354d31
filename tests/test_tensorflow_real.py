"""Real TensorFlow (tensorflow-cpu 2.21.0, in its own venv) through mlaunch, locally simulated.

- MultiWorkerMirroredStrategy, 2 workers, custom training loop (Keras 3 ``fit`` fails under
  MWMS): exit 0 and identical weights on both workers.
- ParameterServerStrategy, chief + 1 ps + 2 workers: the ps and workers serve forever; mlaunch
  stops them once the chief has exited 0, the job exits 0, and every scheduled step landed on
  the ps-held variable exactly once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import EXAMPLES, clean_env, run_mlaunch
from framework_venvs import tensorflow_python  # noqa: F401 - session fixture

pytestmark = pytest.mark.slow


def job_from_example(tmp_path: Path, example: str, python: Path) -> Path:
    text = (EXAMPLES / "tensorflow" / example).read_text()
    job = tmp_path / example
    job.write_text(f"{text}\npython: {python}\ncode_dir: {EXAMPLES / 'tensorflow'}\nlog_dir: {tmp_path / 'logs'}\n")
    return job


def final_weights(output: str) -> list[tuple[str, str]]:
    return re.findall(r"\] final-weights (\w+) (\[.*\])", output)


def test_multi_worker_mirrored_two_workers(tmp_path: Path, tensorflow_python: Path) -> None:  # noqa: F811
    result = run_mlaunch(
        [str(job_from_example(tmp_path, "mwms.yaml", tensorflow_python))], env=clean_env(), timeout=240
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    weights = final_weights(result.stdout)
    assert len(weights) == 2 and weights[0] == weights[1], out[-4000:]
    losses = [(float(a), float(b)) for a, b in re.findall(r"loss ([\d.]+) -> ([\d.]+)", result.stdout)]
    assert len(losses) == 2 and all(last < first / 100 for first, last in losses)
    assert (tmp_path / "logs" / "worker1.log").read_text().count("final-weights") == 1


def test_parameter_server_strategy_chief_ps_two_workers(tmp_path: Path, tensorflow_python: Path) -> None:  # noqa: F811
    job = job_from_example(tmp_path, "ps_strategy.yaml", tensorflow_python)
    result = run_mlaunch([str(job)], env=clean_env(), timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    weights = final_weights(result.stdout)
    assert weights == [(weights[0][0], "[40.0, 40.0, 40.0, 40.0]")], out[-4000:]
    assert "w lives on /job:ps/" in result.stdout and "on 2 workers" in result.stdout
    assert "stopping ps 0, worker 0, worker 1" in result.stderr
