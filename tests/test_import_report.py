"""What a rank reports of its imports while an import is still under way (``launchers.elastic.ipc.import_report``).

The warm parent imports the report's modules last-finished first and names them to the user; a module
half-way through its import must not be listed, or the warm parent learns (and names) the first module that
import finished instead of the one the script imported. The CI run that found it named
``torch._inductor.cudagraph_utils`` where the script had imported ``torch._dynamo``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from launchers.elastic.ipc import import_report

PACKAGE = """\
import bigpkg.inner  # finished first
from launchers.elastic.ipc import import_report
SEEN = import_report.snapshot()
WROTE_MID_IMPORT = import_report.write(REPORT, whole_only=True)
"""


@pytest.fixture
def installed_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` counts as an installed location, and ``bigpkg`` in it is importable (and forgotten after)."""
    site = tmp_path / "site"
    (site / "bigpkg").mkdir(parents=True)
    (site / "bigpkg" / "inner.py").write_text("X = 1\n")
    monkeypatch.setattr(import_report, "_installed", (str(site) + "/",))
    monkeypatch.setattr(import_report, "_written", -1)
    monkeypatch.syspath_prepend(str(site))
    yield site
    for name in [n for n in sys.modules if n == "bigpkg" or n.startswith("bigpkg.")]:
        del sys.modules[name]
        import_report._verdicts.pop(name, None)


def test_a_module_half_way_through_its_import_is_left_out_and_the_hook_waits_for_it(installed_tmp: Path) -> None:
    report = installed_tmp.parent / "report.imports"
    (installed_tmp / "bigpkg" / "__init__.py").write_text(f"REPORT = {str(report)!r}\n" + PACKAGE)
    import bigpkg  # type: ignore[import-not-found]

    names, busy = [name for name, _ in bigpkg.SEEN[0]], bigpkg.SEEN[1]
    assert "bigpkg.inner" in names and "bigpkg" not in names and busy
    assert bigpkg.WROTE_MID_IMPORT is False and not report.exists()

    assert import_report.write(str(report), whole_only=True)
    listed = [name for name, _ in import_report.read(str(report))]
    assert listed[-1] == "bigpkg" and "bigpkg.inner" in listed  # the warm parent's first import: the package
