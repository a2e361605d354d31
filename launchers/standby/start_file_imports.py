"""A first guess at what the ranks import: the installed packages their start file imports at its top.

Learning (``preload_learning``) sees the ranks' imports only once they ran, so without
``preload:`` the first attempt's ranks each imported torch themselves — seconds of CPU each, and
on a 4-rank node of 2 cores four such imports at once, then a fifth in the warm parent once it
learned them — and only the restarts were forked warm. The start file's own top-level
``import`` statements name most of that before anything runs: the warm parent imports them
with mlaunch's start, and the first attempt's ranks are forked from it as well.

Only what is safe to import outside a rank is guessed, by the rules learning follows: a module
mlaunch's own interpreter (the ranks' one) finds installed, never a name the job's own
directories (or the ``PYTHONPATH`` it gives its ranks) could also answer — it may read the rank's
environment at import, and a forked rank would find the warm parent's module in ``sys.modules``
instead of its own — and no standard-library module (cheap, and often mlaunch's own already).
Imports under ``if`` (often ``TYPE_CHECKING`` or a platform test) are left to learning; those in
a top-level ``try`` count.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Iterable

from launchers.plan import ProcessSpec

MAX_SOURCE = 4 << 20  # bytes: a start file larger than this is not read (generated code; learning still works)


def job_dirs(specs: list[ProcessSpec]) -> set[str]:
    """The job's own directories: working directories and the start files' directories."""
    dirs = {spec.cwd for spec in specs}
    dirs.update(os.path.dirname(os.path.abspath(os.path.join(spec.cwd, spec.argv[2]))) for spec in specs)
    return dirs


def top_level_imports(source: str) -> list[str]:
    """The absolute modules ``source`` imports at its top level (and in top-level ``try`` bodies), in order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    statements: list[ast.stmt] = list(tree.body)
    while statements:
        node = statements.pop(0)
        if isinstance(node, ast.Try):
            statements[:0] = node.body
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            found.append(node.module)
    return list(dict.fromkeys(found))


def shadowed(root: str, dirs: Iterable[str]) -> bool:
    """Whether one of ``dirs`` holds a module or package named ``root`` (the job's code could answer it)."""
    for directory in dirs:
        try:
            entries = os.listdir(directory)
        except OSError:
            continue
        if root in entries or any(e.startswith(root + ".") for e in entries):
            return True
    return False


def installed(root: str) -> bool:
    """Whether this interpreter finds ``root`` (without importing it) outside its standard library."""
    if root in sys.stdlib_module_names or root in sys.builtin_module_names:
        return False
    try:
        return importlib.util.find_spec(root) is not None
    except (ImportError, ValueError):
        return False


def same_interpreter(python: str) -> bool:
    """Whether the ranks run mlaunch's own interpreter (its installed packages are theirs)."""
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def guess(start_file: str, python: str, dirs: Iterable[str], python_path: str = "") -> list[str]:
    """The modules the warm parent may import before the first attempt for ranks running ``start_file``."""
    if not same_interpreter(python):
        return []
    try:
        if os.path.getsize(start_file) > MAX_SOURCE:
            return []
        with open(start_file, encoding="utf-8", errors="replace") as handle:
            source = handle.read()
    except OSError:
        return []
    answering = [*dirs, *(p for p in python_path.split(os.pathsep) if p)]
    return [
        name
        for name in top_level_imports(source)
        if (root := name.partition(".")[0]) and not shadowed(root, answering) and installed(root)
    ]


def guess_for(specs: list[ProcessSpec]) -> list[str]:
    """``guess`` for a node's ranks (``python -u start.py ...``), merged over their distinct start files."""
    dirs = job_dirs(specs)
    starts = [(os.path.join(s.cwd, s.argv[2]), s.argv[0], s.env.get("PYTHONPATH", "")) for s in specs]
    merged: dict[str, None] = {}
    for start_file, python, python_path in dict.fromkeys(starts):
        merged.update(dict.fromkeys(guess(start_file, python, dirs, python_path)))
    return list(merged)
