"""The small Python helper that generated scripts carry inside them (standard library only).

``ma_pre_start.sh`` runs before mlaunch is installed, so it cannot call mlaunch; the few things
that are awkward or unsafe in shell are done here instead, by the interpreter the script
installs into. ``launchers/generate/prestart.py`` embeds this file's source verbatim in the scripts
(a quoted here-document: nothing in it is expanded by the shell), so it is a real, linted,
tested module rather than a string. Keep it compatible with old interpreters (3.8): it may run
under whatever ``python3`` a platform image has, before anything is installed.

Subcommands (``python - CMD ARGS``, output for the calling script):
- ``glob DIR PATTERN``: files under DIR matching PATTERN, NUL-separated, sorted. Globbing
  here rather than in bash keeps spaces, quotes and newlines in names intact, and every match
  is checked to lie inside DIR.
- ``installed WHEEL``: exit 0 when exactly this wheel's files (same version, same hashes)
  are what this interpreter imports; 3 when the distribution is an editable install (a
  developer's checkout, which a pre-start must not replace); 1 otherwise. Prints ``name version``
  (and the checkout for an editable install). Comparing hashes, not versions, catches a rebuilt
  wheel with an unchanged version, which ``pip install`` would otherwise call "already satisfied".
- ``console-script DIST NAME``: absolute path of the console script ``NAME`` that ``pip``
  installed for distribution ``DIST`` into this interpreter's own scripts directory (exit 1 if
  there is none: e.g. a venv that sees the distribution through ``--system-site-packages``,
  whose script would start the other interpreter).
- ``file-url PATH``: PATH as a ``file://`` URL. pip reads a plain path argument as a requirement
  line, where ``; `` starts an environment marker; a percent-encoded URL keeps any path intact.
- ``fingerprint FILE``: sha256 of FILE's content, this interpreter and its prefix: the key of
  the "already done in this container" marker.
"""

from __future__ import annotations

import csv
import email.parser
import glob
import hashlib
import os
import sys
import zipfile
from collections.abc import Callable


def _inside(path: str, root: str) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def cmd_glob(root: str, pattern: str) -> int:
    matches = sorted(glob.glob(os.path.join(glob.escape(root), pattern)))
    out = [m for m in matches if os.path.isfile(m) and _inside(m, root)]
    sys.stdout.write("".join(os.path.abspath(m) + "\0" for m in out))
    return 0


def _wheel_contents(path: str) -> tuple[str, str, dict[str, str]]:
    """(name, version, {installed path: 'sha256=...'}) from the wheel's METADATA and RECORD."""
    with zipfile.ZipFile(path) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
        dist_infos = sorted(t for t in tops if t.endswith(".dist-info"))
        if len(dist_infos) != 1:
            raise ValueError(f"{path} is not a wheel (expected one *.dist-info directory)")
        dist_info = dist_infos[0]
        meta = email.parser.Parser().parsestr(zf.read(dist_info + "/METADATA").decode("utf-8"))
        record = zf.read(dist_info + "/RECORD").decode("utf-8")
    files: dict[str, str] = {}
    for row in csv.reader(record.splitlines()):
        if len(row) < 2 or not row[1] or row[0].startswith(dist_info + "/"):
            continue
        parts = row[0].split("/")
        if parts[0].endswith(".data"):
            # purelib/platlib land in site-packages; scripts, headers and data elsewhere: not compared
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue
            parts = parts[2:]
        files["/".join(parts)] = row[1]
    return str(meta["Name"]), str(meta["Version"]), files


def cmd_installed(path: str) -> int:
    from importlib import metadata

    name, version, files = _wheel_contents(path)
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        print(f"{name} {version}")
        return 1
    editable = _editable_location(dist)
    if editable is not None:
        print(f"{name} {version} {editable}")
        return 3
    print(f"{name} {version}")
    if dist.version != version:
        return 1
    have = {}
    for entry in dist.files or []:
        if entry.hash is not None:
            have[entry.as_posix()] = f"{entry.hash.mode}={entry.hash.value}"
    return 0 if all(have.get(p) == h for p, h in files.items()) else 1


def _editable_location(dist: object) -> str | None:
    """The project directory of an editable install (PEP 610 ``direct_url.json``), else None."""
    import json

    text = dist.read_text("direct_url.json")  # type: ignore[attr-defined]
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if isinstance(info, dict) and (info.get("dir_info") or {}).get("editable"):
        return str(info.get("url", "")).replace("file://", "", 1)
    return None


def cmd_console_script(dist_name: str, script: str) -> int:
    from importlib import metadata

    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return 1
    import sysconfig

    own_dirs = set()
    for scheme in (None, f"{os.name}_user"):
        try:
            path = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        own_dirs.add(os.path.realpath(path))
    for entry in dist.files or []:
        if entry.name == script and entry.parent.name in ("bin", "Scripts"):
            located = os.path.abspath(str(entry.locate()))
            if os.path.realpath(os.path.dirname(located)) in own_dirs and os.access(located, os.X_OK):
                print(located)
                return 0
    return 1


def cmd_file_url(path: str) -> int:
    import pathlib

    print(pathlib.Path(os.path.abspath(path)).as_uri())
    return 0


def cmd_fingerprint(path: str) -> int:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        digest.update(fh.read())
    for part in (os.path.realpath(sys.executable), sys.prefix, str(os.getuid())):
        digest.update(b"\0" + part.encode("utf-8", "surrogateescape"))
    print(digest.hexdigest()[:32])
    return 0


COMMANDS: dict[str, tuple[Callable[..., int], int]] = {
    "glob": (cmd_glob, 2),
    "installed": (cmd_installed, 1),
    "console-script": (cmd_console_script, 2),
    "file-url": (cmd_file_url, 1),
    "fingerprint": (cmd_fingerprint, 1),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS or len(argv) - 1 != COMMANDS[argv[0]][1]:
        sys.stderr.write(f"usage: helper {{{','.join(COMMANDS)}}} ARGS (got {argv!r})\n")
        return 2
    func, _ = COMMANDS[argv[0]]
    try:
        return int(func(*argv[1:]))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        sys.stderr.write(f"{argv[0]}: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
