"""The documentation: the README's promises, the MkDocs site builds strictly, and its shell examples run.

- README.md stays short (under 200 lines), starts with the two commands, and its test command is
  exactly the one ``.ci/run`` runs; its links point at files that exist.
- The generated references (``docs/gen/reference.py``, an MkDocs hook) name every job.yaml key of
  the model and every ``mlaunch`` command.
- ``mkdocs build --strict`` passes (a broken link or anchor, a page missing from the nav, fails it).
  Skipped with the reason where MkDocs is not installed — never in CI, where the ``docs`` extra is.
- Every ```bash block in ``docs/`` runs with bash in a copy of the checkout (its tracked and
  untracked, not ignored, files), exit 0 — unless the line before it says
  ``<!-- not run: REASON -->`` (a Kubernetes or Slurm cluster, a framework the machine lacks, a
  package install). Slow: it trains the example once and type-checks the copy.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT, clean_env

DOCS = ROOT / "docs"
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(\S[^>]*?)\s*-->\s*$")


def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "gen" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bash_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, text, why it is not run or None) of every ```bash block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) != "bash":
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        blocks.append((text.count("\n", 0, match.start()) + 1, match.group(2), marker.group(1) if marker else None))
    return blocks


def doc_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "gen" not in p.relative_to(DOCS).parts)


# -- README ------------------------------------------------------------------------------------------
def test_readme_is_short_starts_with_the_two_commands_and_its_test_command_is_ci() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    (_, first, _), (_, second, _), *_ = bash_blocks(README)
    assert first.startswith("pip install") and "mlaunch --engine pytorch examples/pytorch/job.yaml" in first
    assert text.index(first) < text.index("## What mlaunch is")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    marker = ci.index("# The README's test command, exactly:")
    assert second.strip() == ci[marker + 1].strip(), (second, ci[marker + 1])


def test_readme_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the documentation pages"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


BENCHMARK = re.compile(r"python3? (?:-m (benchmarks(?:\.\w+)+)|(benchmarks/[\w/]+(?:\.py)?))")


def benchmark_runs(module: str, path: str) -> bool:
    """``python -m benchmarks.X`` or ``python benchmarks/X[.py]`` names a script or a package with ``__main__``."""
    target = ROOT / (module.replace(".", "/") if module else path)
    if target.suffix == ".py":
        return target.is_file()
    return (target / "__main__.py").is_file() or (module != "" and target.with_suffix(".py").is_file())


def test_every_benchmark_command_in_the_docs_names_one_that_exists() -> None:
    """A benchmark that moves (issue 46: ``benchmarks/chaos.py`` became the package ``benchmarks/chaos/``)
    leaves no command behind that names its old place: in the README, a page or a benchmark's own usage."""
    commands, missing = 0, []
    for page in [README, *doc_pages(), *sorted((ROOT / "benchmarks").rglob("*.py"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for module, path in BENCHMARK.findall(line):
                commands += 1
                if not benchmark_runs(module, path):
                    missing.append(f"{page.relative_to(ROOT)}:{number} {module or path}")
    assert commands > 20, "the benchmark commands were found"
    assert not missing, "commands naming no benchmark: " + ", ".join(missing)


def test_every_shell_block_in_the_docs_is_bash() -> None:
    """The example test runs ```bash blocks: a shell example under another fence would escape it."""
    for page in doc_pages():
        kinds = {m.group(1) for m in FENCE.finditer(page.read_text(encoding="utf-8"))}
        assert not kinds & {"sh", "shell", "console", "zsh"}, (page, kinds)


# -- the generated references -------------------------------------------------------------------------
def test_the_generated_references_name_every_key_and_every_command() -> None:
    from launchers.config.job import Job, job_json_schema

    ref = reference()
    page = ref.job_yaml_markdown(job_json_schema())

    def keys(model: type, prefix: str = "") -> list[str]:
        found = []
        for name, info in model.model_fields.items():
            found.append(f"{prefix}{name}")
            annotation = info.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                found += keys(annotation, f"{prefix}{name}.")
        return found

    missing = [key for key in keys(Job) if f"`{key}`" not in page]
    assert not missing, missing
    group = ref.mlaunch_group()
    cli = ref.cli_markdown(group)
    assert len(group.commands) >= 10
    for name, command in group.commands.items():
        assert f"## `mlaunch {name}`" in cli, name
        for param in command.params:
            if getattr(param, "help", None):
                assert f"`{param.opts[0]}`" in cli, (name, param.opts)


def test_the_control_planes_message_table_is_generated_from_the_protocol() -> None:
    """docs/control-plane.md keeps the marker; the table names every kind and every field of it."""
    from launchers.control import messages

    ref = reference()
    assert ref.MESSAGES_MARKER in (DOCS / ref.MESSAGES_PAGE).read_text(encoding="utf-8")
    table = ref.messages_markdown()
    for cls in messages.ALL:
        assert f"| `{cls.KIND}` |" in table, cls.KIND
        for name in messages.field_names(cls):
            assert f"`{name}`" in table, (cls.KIND, name)


# -- the site ---------------------------------------------------------------------------------------------
def mkdocs_or_skip() -> str:
    exe = shutil.which("mkdocs", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed; CI installs it with the docs extra (pip install -e '.[docs]')")
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (CI installs it and runs this test)")
    return exe


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    exe = mkdocs_or_skip()
    env = clean_env(NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [exe, "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("reference/job-yaml/index.html", "reference/cli/index.html", "platforms/slurm/index.html"):
        assert (tmp_path / "site" / page).exists(), page
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "mlaunch manifest" in cli and "--target" in cli


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [str(p.relative_to(DOCS)) for p in doc_pages() if f": {p.relative_to(DOCS)}" not in nav]
    assert not missing, missing


# -- the examples -----------------------------------------------------------------------------------------
def checkout_copy(dest: Path) -> Path:
    """The checkout as a user has it (tracked and untracked, not ignored, files), without build outputs."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_every_example_is_run_or_says_why_not() -> None:
    blocks = [(page, line, why) for page in doc_pages() for line, _, why in bash_blocks(page)]
    assert len(blocks) >= 15
    for page, line, why in blocks:
        assert why is None or len(why) > 10, f"{page}:{line}: say why it is not run"
    assert sum(why is None for _, _, why in blocks) >= 10  # most of them run


@pytest.mark.slow
def test_the_shell_examples_in_the_docs_run(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to copy")
    work = checkout_copy(tmp_path / "checkout")
    env = clean_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's mlaunch, mypy, ruff
    failures = []
    for page in doc_pages():
        for line, text, why in bash_blocks(page):
            if why is not None:
                continue
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", text],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            output = done.stdout + done.stderr
            if done.returncode != 0 or "Traceback" in output:
                failures.append(f"{page.relative_to(ROOT)}:{line} exited {done.returncode}\n{text}\n{output[-3000:]}")
    assert not failures, "\n\n".join(failures)
