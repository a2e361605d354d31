"""Reading a file the user named (job.yaml, a rank table): a missing or unreadable one is their mistake."""

from __future__ import annotations

from pathlib import Path

from launchers.errors import UserError


def read_text(path: Path, what: str, error: type[UserError], on_directory: str) -> str:
    """The UTF-8 text of ``path``; otherwise ``error`` saying what is wrong with ``what`` (e.g. "job file").

    ``on_directory`` is the whole message for a directory given where a file was expected.
    """
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise error(on_directory) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None
