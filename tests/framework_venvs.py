"""Session fixtures that build the real framework environments the slow suites run jobs in.

TensorFlow and MindSpore are large (1.6 GB and 2.8 GB installed) and pin NumPy versions that
fight each other and torch, so each gets its own virtual environment, built once into a cache
directory (``$MLAUNCH_TEST_CACHE`` or ``~/.cache/mlaunch-tests``) and reused by later runs.
mlaunch itself keeps running from the main environment; a job points ``python:`` in its
job.yaml at the venv's interpreter.

A build that cannot finish (no registry, no disk) skips the tests that need it, with the
installer's last lines as the reason; it is retried on the next session. A file lock keeps two
pytest processes from building the same venv at once. ``python tests/framework_venvs.py
tensorflow mindspore`` builds them ahead of a test run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class VenvSpec:
    """One framework environment: what to install, and a probe that proves it works."""

    key: str
    dirname: str
    requirements: tuple[str, ...]
    probe: str  # Python code run with the venv's interpreter; must exit 0
    timeout: float = 1800.0
    # sees the packages of the interpreter running the tests (torch, lightning, mlaunch) instead of
    # installing its own torch; its name then carries a hash of that interpreter's prefix
    inherit: bool = False
    # further ``pip install`` runs after ``requirements``: (extra pip arguments, extra env) each
    more: tuple[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], ...] = ()


TENSORFLOW = VenvSpec(
    key="tensorflow",
    dirname="tensorflow-cpu-2.21.0",
    requirements=("tensorflow-cpu==2.21.0",),
    probe="import tensorflow as tf; assert tf.__version__.startswith('2.21'), tf.__version__",
)

# MindSpore 2.10.0's wheel was built against NumPy 1.x; with NumPy 2 a worker hangs at exit.
MINDSPORE = VenvSpec(
    key="mindspore",
    dirname="mindspore-2.10.0-numpy1",
    requirements=("mindspore==2.10.0", "numpy<2"),
    probe=(
        "import numpy, mindspore; assert numpy.__version__.startswith('1.'), numpy.__version__; "
        "assert mindspore.__version__.startswith('2.10'), mindspore.__version__"
    ),
)

# The trainers of tests/test_trainers_*.py (transformers needs accelerate for its Trainer). DeepSpeed ships
# sources only: DS_BUILD_OPS=0 installs it without compiling (it builds its CPU Adam op at start-up) and
# --no-build-isolation lets its setup.py import the torch it builds against.
TRAINERS = VenvSpec(
    key="trainers",
    dirname="trainers-tf5.24-acc1.15-ds0.19.8",
    requirements=("transformers==5.24.0", "accelerate==1.15.0"),
    probe=(
        "import transformers, accelerate, lightning, torch, deepspeed, launchers; "
        "assert transformers.__version__ == '5.24.0', transformers.__version__"
    ),
    inherit=True,
    more=((("--no-build-isolation", "deepspeed==0.19.8"), (("DS_BUILD_OPS", "0"), ("DS_ACCELERATOR", "cpu"))),),
)

SPECS = {spec.key: spec for spec in (TENSORFLOW, MINDSPORE, TRAINERS)}
READY_MARKER = ".mlaunch-ready"


class VenvUnavailable(RuntimeError):
    """The environment could not be built here; the message says why (used as a skip reason)."""


def cache_dir() -> Path:
    root = os.environ.get("MLAUNCH_TEST_CACHE") or str(Path.home() / ".cache" / "mlaunch-tests")
    return Path(root).expanduser()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _run(argv: list[str], timeout: float, what: str, env: dict[str, str] | None = None) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise VenvUnavailable(f"{what} took longer than {timeout:.0f}s") from None
    except OSError as exc:
        raise VenvUnavailable(f"{what} could not start: {exc}") from None
    if proc.returncode != 0:
        raise VenvUnavailable(f"{what} failed (exit {proc.returncode}): {_tail(proc.stdout + proc.stderr)}")


def ensure_venv(spec: VenvSpec, root: Path | None = None) -> Path:
    """The venv's interpreter, building the venv first unless a finished one is cached."""
    root = root or cache_dir()
    venv = root / "venvs" / _dirname(spec)
    python = venv_python(venv)
    if (venv / READY_MARKER).exists() and python.exists():
        return python
    try:
        root.joinpath("venvs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VenvUnavailable(f"cannot create the cache directory {root}: {exc}") from None
    with open(root / "venvs" / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest may be building it right now
        if (venv / READY_MARKER).exists() and python.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a half-built venv from an interrupted run
        started = time.monotonic()
        _run([sys.executable, "-m", "venv", str(venv)], 300, f"creating the {spec.key} venv")
        if spec.inherit:
            _see_this_python(python)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run([*pip, *spec.requirements], spec.timeout, f"pip install {' '.join(spec.requirements)}")
        for args, env in spec.more:
            _run([*pip, *args], spec.timeout, f"pip install {' '.join(args)}", env={**os.environ, **dict(env)})
        _run([str(python), "-c", spec.probe], 300, f"importing {spec.key} in its venv")
        (venv / READY_MARKER).write_text(f"built in {time.monotonic() - started:.0f}s\n")
    return python


def _dirname(spec: VenvSpec) -> str:
    if not spec.inherit:
        return spec.dirname
    import hashlib

    return f"{spec.dirname}-{hashlib.sha256(sys.prefix.encode()).hexdigest()[:10]}"


def _see_this_python(python: Path) -> None:
    """Let the venv see the packages of the interpreter running the tests (after its own, as
    ``--system-site-packages`` would; see ``conftest.venv_seeing_this_python``)."""
    import site

    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    dirs = [d for d in dict.fromkeys(site.getsitepackages()) if os.path.isdir(d)]
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
    Path(purelib, "_mlaunch_tests_parent_site.pth").write_text(lines)


def _fixture_python(key: str) -> Path:
    try:
        return ensure_venv(SPECS[key])
    except VenvUnavailable as exc:
        pytest.skip(f"{key} environment unavailable: {exc}")


@pytest.fixture(scope="session")
def tensorflow_python() -> Iterator[Path]:
    """Interpreter of a venv with tensorflow-cpu 2.21.0 (skips the test when it cannot be built)."""
    yield _fixture_python("tensorflow")


@pytest.fixture(scope="session")
def mindspore_python() -> Iterator[Path]:
    """Interpreter of a venv with mindspore 2.10.0 and numpy<2 (skips the test when it cannot be built)."""
    yield _fixture_python("mindspore")


@pytest.fixture(scope="session")
def trainers_python() -> Iterator[Path]:
    """Interpreter of a venv with transformers, accelerate and deepspeed that also sees this interpreter's
    torch, lightning and mlaunch (skips the test when it cannot be built; fails under CI)."""
    try:
        yield ensure_venv(TRAINERS)
    except VenvUnavailable as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must run the trainer tests: trainers environment unavailable: {exc}")
        pytest.skip(f"trainers environment unavailable: {exc}")


if __name__ == "__main__":
    for name in sys.argv[1:] or list(SPECS):
        t0 = time.monotonic()
        print(f"{name}: {ensure_venv(SPECS[name])} ({time.monotonic() - t0:.0f}s)", flush=True)
