"""The first attempt's ranks forked from a warm parent that imported what their start file imports.

Pure tests read start files the way mlaunch does before anything runs; the job tests run real
mlaunch, a real warm parent and real forked ranks, and ask the ranks what they found already
imported when their script began.
"""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import run_mlaunch

from launchers.standby.start_file_imports import guess, top_level_imports

START = """\
from __future__ import annotations
import os, json as j
import yaml.constructor
from psutil import Process
from . import sibling
try:
    import paramiko
except ImportError:
    import nothing_here
if os.environ.get("X"):
    import numpy
def later():
    import pydantic
"""


def test_only_top_level_absolute_imports_count() -> None:
    """Top level and top-level ``try`` bodies, in order; never ``if`` (``TYPE_CHECKING``), a function, a
    relative import or ``__future__``."""
    assert top_level_imports(START) == ["os", "json", "yaml.constructor", "psutil", "paramiko"]
    assert top_level_imports("import (\n") == []  # a start file that does not parse: its rank will say why


def test_the_guess_keeps_installed_packages_and_nothing_the_job_could_answer(tmp_path: Path) -> None:
    """Standard library out (cheap, often mlaunch's own); a name the job's directories or the PYTHONPATH it
    gives its ranks also hold out (the rank would find the warm parent's module instead of its own);
    another interpreter: nothing (its packages are not the ones mlaunch sees)."""
    start = tmp_path / "train.py"
    start.write_text("import os\nimport yaml\nimport psutil\nimport paramiko\nimport jobhelper\nimport not_installed\n")
    (tmp_path / "jobhelper.py").write_text("")
    assert guess(str(start), sys.executable, [str(tmp_path)]) == ["yaml", "psutil", "paramiko"]
    own = tmp_path / "own"
    (own / "psutil").mkdir(parents=True)  # a job's package named like an installed one
    assert guess(str(start), sys.executable, [str(tmp_path), str(own)]) == ["yaml", "paramiko"]
    vendored = tmp_path / "vendored"
    vendored.mkdir()
    (vendored / "yaml.py").write_text("")
    assert guess(str(start), sys.executable, [str(tmp_path)], python_path=str(vendored)) == ["psutil", "paramiko"]
    assert guess(str(start), "/usr/bin/some-other-python", [str(tmp_path)]) == []
    assert guess(str(tmp_path / "missing.py"), sys.executable, [str(tmp_path)]) == []


SEES = """\
import os, sys
before = {name: name in sys.modules for name in ("yaml", "psutil", "jobhelper")}
import yaml
import psutil
import jobhelper
print("sees", os.environ["RANK"], sorted(n for n, v in before.items() if v), flush=True)
"""


def job_yaml(tmp_path: Path, extra: str = "", procs: int = 2) -> Path:
    (tmp_path / "sees.py").write_text(SEES)
    (tmp_path / "jobhelper.py").write_text("import os\nRANK = os.environ['RANK']  # reads the rank's env\n")
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: sees.py\nprocs_per_node: {procs}\nlog_dir: {tmp_path}/logs\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\n{extra}"
    )
    return job


def test_the_first_ranks_fork_from_a_warm_parent_that_imported_the_start_files_packages(tmp_path: Path) -> None:
    """Restarts and no ``preload:``: both first ranks start with the start file's installed imports done,
    never the job's own module, and mlaunch says what it preloaded (before, they started cold and only
    the restarts were forked, from what the ranks were seen to import)."""
    result = run_mlaunch(["--engine", "pytorch", str(job_yaml(tmp_path))], timeout=120)
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if "sees" in line)
    assert lines == ["[rank 0] sees 0 ['psutil', 'yaml']", "[rank 1] sees 1 ['psutil', 'yaml']"], result.stderr
    said = [line for line in result.stderr.splitlines() if "preload: the start file imports" in line]
    assert len(said) == 1 and "yaml" in said[0] and "psutil" in said[0] and "jobhelper" not in said[0], said


def test_preload_learning_false_or_preload_fork_false_start_the_ranks_cold(tmp_path: Path) -> None:
    """The guess is part of learning, and forking is what makes it pay: either switched off, each rank
    imports for itself, as before. So does a node whose ranks may run several OpenMP threads: torch and
    numpy would start them in the warm parent at import, be refused, and the ranks start cold after that."""
    for extra in ("preload_learning: false\n", "preload_fork: false\n", "env: {OMP_NUM_THREADS: '2'}\n"):
        result = run_mlaunch(["--engine", "pytorch", str(job_yaml(tmp_path, extra))], timeout=120)
        assert result.returncode == 0, result.stderr
        lines = sorted(line for line in result.stdout.splitlines() if "sees" in line)
        assert lines == ["[rank 0] sees 0 []", "[rank 1] sees 1 []"], extra
        assert "preload: the start file imports" not in result.stderr


def test_one_rank_starts_cold_as_before(tmp_path: Path) -> None:
    """One rank on a node pays one import either way, and torch would start its OpenMP threads in a warm
    parent there (``OMP_NUM_THREADS`` is set only for several ranks): nothing is guessed."""
    result = run_mlaunch(["--engine", "pytorch", str(job_yaml(tmp_path, procs=1))], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[rank 0] sees 0 []" in result.stdout.splitlines(), result.stdout + result.stderr
    assert "preload:" not in result.stderr
