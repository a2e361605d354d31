"""Run mlaunch's real entry point (``launchers.cli.main.main``) in this process, output captured.

For suites that run the CLI thousands of times (the fuzz suite): a subprocess costs ~0.3 s of
start-up per case; in-process the same ``main()`` runs with a given environment and argv, and
an exception escaping it is reported as a traceback, just as the console script would show it.
"""

from __future__ import annotations

import contextlib
import io
import os
import traceback
from dataclasses import dataclass

from launchers.cli.main import main


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str
    traceback: str | None  # an exception that escaped main(): a bug


@contextlib.contextmanager
def environment(env: dict[str, str]):  # type: ignore[no-untyped-def]
    """``os.environ`` is exactly ``env`` inside the block (restored afterwards)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_cli(args: list[str], env: dict[str, str]) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    code, trace = 0, None
    with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - anything escaping main() is what the suite hunts
            code, trace = 1, traceback.format_exc()
    return CliResult(code, out.getvalue(), err.getvalue(), trace)
