"""Packaging: a built wheel carries the templates and installs into a fresh environment.

Uses the pip and setuptools already installed (no build isolation, so it works offline).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, venv_seeing_this_python


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("mlaunch-*.whl")
    return wheel


def test_wheel_contains_packages_and_every_template(built_wheel: Path) -> None:
    names = set(zipfile.ZipFile(built_wheel).namelist())
    for module in (
        "launchers/cli/main.py",
        "launchers/run/supervisor.py",
        "launchers/engines/pytorch.py",
        "launchers/elastic/__init__.py",
        "bootstrap/__init__.py",
        "launchers/templates/__init__.py",
    ):
        assert module in names
    templates = sorted(p.name for p in (ROOT / "templates").glob("*.j2"))
    assert templates, "the repository ships Jinja2 templates"
    for name in templates:
        assert f"launchers/templates/{name}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mlaunch = launchers.cli.main:main" in zipfile.ZipFile(built_wheel).read(entry_points).decode()


def test_wheel_installs_and_runs_in_a_fresh_venv(built_wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    python = venv_seeing_this_python(env_dir)  # the wheel's dependencies come from the test environment
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(built_wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    job = tmp_path / "job.yaml"
    (tmp_path / "t.py").write_text("print('ok')\n")
    job.write_text("entry: t.py\nengine: pytorch\nprocs_per_node: 2\n")
    # Run from tmp_path so the checkout's own `launchers/` is not on sys.path.
    plan = subprocess.run(
        [str(env_dir / "bin" / "mlaunch"), "plan", "--json", str(job)],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert plan.returncode == 0, plan.stderr
    assert '"world_size": 2' in plan.stdout
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import launchers, importlib.resources as r; print(launchers.__file__);"
            "print(sorted(p.name for p in r.files('launchers.templates').iterdir()))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(env_dir) in where.stdout.splitlines()[0]
    assert ".j2" in where.stdout
