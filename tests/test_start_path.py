"""What ``mlaunch`` imports on its way to the first process: the start-up cost paid on every node and restart.

Each case runs the real CLI (``python -m launchers``) in a fresh interpreter with
``-X importtime`` and reads which modules it loaded. Times are not asserted here (that is
``benchmarks/launch_overhead.py``'s job); the modules are, because each one below cost
10–45 ms of every start when it crept back in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported(args: list[str], cwd: Path) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "launchers", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(cwd)},
    )
    mods = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return mods, proc


def write_job(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('trained')\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"entry: {tmp_path / 'train.py'}\nnodes: 1\nprocs_per_node: 2\nlog_dir: {tmp_path / 'logs'}\n")
    return job


def test_a_run_loads_neither_package_metadata_nor_psutil(tmp_path: Path) -> None:
    """pydantic's plugin scan (importlib.metadata, email, zipfile) and psutil at the job's end are kept off the run."""
    mods, proc = imported(["--engine", "pytorch", str(write_job(tmp_path))], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "launchers.config.model" in mods and "pydantic" in mods  # the job really was validated
    assert "importlib.metadata" not in mods
    assert "psutil" not in mods


def test_plan_loads_neither_the_supervisor_nor_the_control_plane(tmp_path: Path) -> None:
    mods, proc = imported(["plan", "--engine", "pytorch", str(write_job(tmp_path))], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "launchers.planning" in mods
    assert not {"launchers.run.supervisor", "launchers.control", "launchers.observe.observer"} & mods
    assert "importlib.metadata" not in mods


def run_python(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT)}
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_plugin_less_loader_still_answers_for_the_rest_of_pydantic() -> None:
    """A name the stand-in does not define comes from pydantic's real loader module (no crash after an upgrade)."""
    out = run_python(
        "from launchers.cli import pydantic_plugins; assert pydantic_plugins.install()\n"
        "import pydantic.plugin._loader as loader, sys\n"
        "print(list(loader.get_plugins()), 'importlib.metadata' in sys.modules)\n"
        "print(loader.PYDANTIC_ENTRY_POINT_GROUP, 'importlib.metadata' in sys.modules)\n"
        "from launchers.config.loader import parse_job\n"
        "from pathlib import Path\n"
        "print(parse_job('entry: t.py\\nnodes: 2\\n', Path('job.yaml')).nodes)\n"
    )
    assert out.splitlines() == ["[] False", "pydantic True", "2"]


def test_a_training_process_keeps_its_pydantic_plugins() -> None:
    """Only the mlaunch command replaces the loader; importing mlaunch's modules as a library does not."""
    out = run_python(
        "import launchers.elastic, launchers.config.job, sys\n"
        "import pydantic.plugin._loader as loader\n"
        "print(hasattr(loader, 'entry_points'))\n"
    )
    assert out == "True"
