"""The newcomer's path: README.md's first command, run as written in a fresh clone and a fresh venv.

The repository is cloned with git (so only what is committed counts, as for anyone who clones it),
a virtual environment is made with ``python -m venv`` (no system site-packages, nothing
preinstalled), and the first ```bash block of the clone's README.md is run with bash in the clone,
the venv's ``bin`` first on PATH, so its ``pip`` and ``mlaunch`` are the ones used. It must exit 0
and the example must print its ``final-checksum``: a dependency that only the developer's
environment happens to have fails here. Slow (pip installs mlaunch's dependencies and torch into
the venv): run with --slow, MLAUNCH_SLOW=1 or CI=true.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env


def first_bash_block(markdown: str) -> str:
    """The text of the first fenced ```bash code block."""
    match = re.search(r"^```bash[ \t]*\n(.*?)^```[ \t]*$", markdown, re.DOTALL | re.MULTILINE)
    assert match, "README.md has no ```bash code block"
    return match.group(1)


def test_first_bash_block_is_the_fenced_text() -> None:
    text = "intro\n\n```\nnot bash\n```\n\n```bash\npip install x && run y\n```\n\n```bash\nsecond\n```\n"
    assert first_bash_block(text) == "pip install x && run y\n"


@pytest.mark.slow
def test_readme_first_command_works_in_a_fresh_clone_and_venv(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to clone")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, capture_output=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    command = first_bash_block((clone / "README.md").read_text(encoding="utf-8"))
    assert command.startswith("pip install"), command

    env = clean_env(VIRTUAL_ENV=str(venv))
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PIP_REQUIRE_VIRTUALENV"):
        env.pop(name, None)  # nothing from the developer's setup may stand in for what the command installs
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", command],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"`{command.strip()}` exited {result.returncode}:\n{output[-6000:]}"
    assert "final-checksum" in result.stdout, output[-6000:]
    assert (venv / "bin" / "mlaunch").exists()  # the command installed mlaunch into the venv, not elsewhere
