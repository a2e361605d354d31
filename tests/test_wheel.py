"""``mlaunch wheel``: the project's own wheel, built offline from the files on disk.

Checked for real: the archive holds every module of ``launchers`` (``launchers.elastic``
included), ``bootstrap`` and every template; its METADATA carries pyproject's dependencies; its
RECORD hashes match; pip installs it into a fresh venv (dependencies from a wheelhouse, with
``--no-index``) where ``mlaunch --help`` and ``from launchers import elastic`` work; and the
installed copy rebuilds a byte-identical wheel.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
import tomllib
from conftest import ROOT, clean_env, run_mlaunch
from test_prestart_fixtures import make_venv, vendor_wheel, wheel_requirements, wheelhouse

from launchers.generate.wheel import WheelMetadata, write_wheel


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def _source_files(package_dir: Path, prefix: str) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
        for name in filenames:
            if name.endswith((".py", ".j2", ".typed")):
                rel = Path(dirpath, name).relative_to(package_dir)
                found.add("/".join([prefix, *rel.parts]))
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    result = run_mlaunch(["wheel", "-o", str(out / "dist")])
    assert result.returncode == 0, result.stderr
    wheel = Path(result.stdout.strip())
    assert wheel.parent == out / "dist" and wheel.name == "mlaunch-0.1.0-py3-none-any.whl"
    return wheel


def test_wheel_holds_every_module_and_template_on_disk(built: Path) -> None:
    names = set(_members(built))
    expected = (
        _source_files(ROOT / "launchers", "launchers")
        | _source_files(ROOT / "bootstrap", "bootstrap")
        | _source_files(ROOT / "templates", "launchers/templates")
    )
    # files another engineer adds while this runs may postdate the wheel; none may be missing from before it
    built_at = built.stat().st_mtime
    missing = {n for n in expected - names if (ROOT / _repo_path(n)).stat().st_mtime < built_at}
    assert not missing, f"not in the wheel: {sorted(missing)}"
    for needed in ("launchers/elastic/__init__.py", "launchers/templates/ma_pre_start.sh.j2", "bootstrap/__init__.py"):
        assert needed in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def _repo_path(arcname: str) -> str:
    return arcname.replace("launchers/templates/", "templates/", 1)


def test_metadata_entry_points_and_record(built: Path) -> None:
    members = _members(built)
    info = "mlaunch-0.1.0.dist-info"
    metadata = members[f"{info}/METADATA"].decode()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "Name: mlaunch\n" in metadata and f"Version: {project['version']}\n" in metadata
    assert f"Requires-Python: {project['requires-python']}" in metadata
    assert wheel_requirements(built) == sorted(project["dependencies"])
    for extra in project["optional-dependencies"]:
        assert f"Provides-Extra: {extra}\n" in metadata
    assert 'Requires-Dist: mpi4py>=3.1; extra == "mpi"' in metadata
    assert "[console_scripts]\nmlaunch = launchers.cli.main:main\n" in members[f"{info}/entry_points.txt"].decode()
    assert "Root-Is-Purelib: true" in members[f"{info}/WHEEL"].decode()
    rows = list(csv.reader(io.StringIO(members[f"{info}/RECORD"].decode())))
    assert {r[0] for r in rows} == set(members)
    for path, digest, size in rows:
        if path.endswith("RECORD"):
            assert digest == size == ""
            continue
        raw = hashlib.sha256(members[path]).digest()
        assert digest == "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        assert int(size) == len(members[path])


def test_write_wheel_is_deterministic(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": b"X = 1\n", "pkg/data/a.txt": b"a\n"}
    meta = WheelMetadata(name="Some.Pkg", version="1.0", requires_dist=["typer>=0.12"])
    one = write_wheel(tmp_path / "one", meta, files)
    two = write_wheel(tmp_path / "two", meta, dict(reversed(files.items())))
    assert one.name == "some_pkg-1.0-py3-none-any.whl"
    assert one.read_bytes() == two.read_bytes()
    with zipfile.ZipFile(one) as zf:
        assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in zf.infolist())
        assert zf.namelist()[-1] == "some_pkg-1.0.dist-info/RECORD"
    assert list(tmp_path.glob("one/.*")) == []  # no temporary file left behind


def test_write_wheel_refuses_paths_outside_the_archive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad path"):
        write_wheel(tmp_path, WheelMetadata(name="x", version="1"), {"../evil.py": b""})


def test_unwritable_output_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_mlaunch(["wheel", "-o", str(blocker / "dist")])
    assert result.returncode == 2
    assert "cannot write the wheel" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def installed(built: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """A fresh venv with the wheel installed offline (dependencies from a cached wheelhouse)."""
    house = wheelhouse(request.config.cache.mkdir("mlaunch-wheelhouse"), wheel_requirements(built))
    python = make_venv(tmp_path_factory.mktemp("venv") / "venv")
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--find-links", str(house), str(built)],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return python


def test_installed_wheel_runs_mlaunch_and_imports_elastic(installed: Path, tmp_path: Path) -> None:
    env = clean_env()
    mlaunch = installed.parent / "mlaunch"
    help_text = subprocess.run([str(mlaunch), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    for command in ("run", "plan", "wheel", "prestart", "entrypoint"):
        assert command in help_text.stdout
    probe = subprocess.run(
        [str(installed), "-c", "from launchers import elastic; import launchers, bootstrap; print(launchers.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert str(installed.parent.parent) in probe.stdout  # imported from the venv, not from the checkout
    rendered = subprocess.run(
        [str(installed), "-c", "from launchers.templating import template_names; print(template_names())"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert "ma_pre_start.sh.j2" in rendered.stdout and "entrypoint.sh.j2" in rendered.stdout


def test_installed_mlaunch_rebuilds_an_identical_wheel(installed: Path, built: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(installed.parent / "mlaunch"), "wheel", "-o", str(tmp_path / "again")],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    again = Path(result.stdout.strip())
    assert _members(again) == _members(built)
    assert again.read_bytes() == built.read_bytes()


def test_vendor_wheel_helper_installs(installed: Path, tmp_path: Path) -> None:
    """The test's vendor wheels (same writer) are real wheels too: pip installs and imports them."""
    wheel = vendor_wheel(tmp_path, "vendor-thing", "0.0.1", {"vendor_thing/__init__.py": "VALUE = 42\n"})
    subprocess.run(
        [str(installed), "-m", "pip", "install", "-q", "--no-index", str(wheel)], check=True, env=clean_env()
    )
    out = subprocess.run([str(installed), "-c", "import vendor_thing; print(vendor_thing.VALUE)"], capture_output=True)
    assert out.stdout.strip() == b"42"
