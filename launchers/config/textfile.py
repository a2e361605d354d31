"""Reading a file the user named (job.yaml, a rank table): a missing or unreadable one is their mistake."""

from __future__ import annotations

from pathlib import Path

from launchers.errors import UserError


def read_text(path: Path, what: str, error: type[UserError], on_directory: str, *, max_bytes: int | None = None) -> str:
    """The UTF-8 text of ``path``; otherwise ``error`` saying what is wrong with ``what`` (e.g. "job file").

    ``on_directory`` is the whole message for a directory given where a file was expected.
    ``max_bytes`` refuses a larger file without reading more than that (a FIFO or /dev/zero too).
    """
    try:
        if max_bytes is None:
            return path.read_text(encoding="utf-8")
        with path.open("rb") as stream:
            data = stream.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise error(f"{what} {path} is larger than {max_bytes:,} bytes (the limit)")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise error(on_directory) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None
