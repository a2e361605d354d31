"""mlaunch's own wheel, written from the package files on disk: offline, deterministic, no build backend.

Why not ``pip wheel``/``python -m build``: a platform node or a CI box may have no registry to
fill a build-isolation environment, and an installed mlaunch has no source tree to build from.
A wheel is a zip with three small metadata files (PEP 427/491), so this module writes it
directly, from a checkout (editable install) or from an installed wheel alike:

- the import packages ``launchers`` (every module and subpackage present, ``launchers.elastic``
  included) and ``bootstrap``, found with ``importlib.util.find_spec`` — nothing is imported;
- ``launchers.templates``, which a checkout keeps at the repository root (pyproject's
  ``package-dir``) and an installed wheel keeps inside ``launchers/``;
- METADATA (name, version, ``Requires-Dist`` with extras), ``entry_points.txt`` (the ``mlaunch``
  console script) from ``pyproject.toml`` in a checkout, else from the installed distribution.

The same bytes come out for the same files: entries sorted, fixed timestamps and modes.
``write_wheel`` is generic, so tests build vendor wheels with it too.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launchers.atomic import write_atomic
from launchers.errors import UserError

DIST_NAME = "mlaunch"
IMPORT_PACKAGES = ("launchers", "bootstrap")
TEMPLATES_PACKAGE = "launchers.templates"
DEFAULT_SCRIPTS = {"mlaunch": "launchers.cli.main:main"}
GENERATOR = "mlaunch-wheel (launchers.generate.wheel)"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip can hold: reproducible builds

_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo", "~", ".swp", ".orig", ".rej")


@dataclass
class WheelMetadata:
    """What goes into ``*.dist-info``: core metadata fields and entry points."""

    name: str
    version: str
    summary: str = ""
    requires_python: str | None = None
    license: str | None = None
    requires_dist: list[str] = field(default_factory=list)
    provides_extra: list[str] = field(default_factory=list)
    entry_points: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def file_stem(self) -> str:
        """``name-version`` as wheel file and dist-info names spell it (PEP 427: ``-`` → ``_``)."""
        name = re.sub(r"[-_.]+", "_", self.name).lower()
        version = self.version.replace("-", "_")
        return f"{name}-{version}"

    def metadata_text(self) -> str:
        lines = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {self.version}"]
        if self.summary:
            lines.append(f"Summary: {self.summary}")
        if self.license:
            lines.append(f"License: {self.license}")
        if self.requires_python:
            lines.append(f"Requires-Python: {self.requires_python}")
        lines += [f"Provides-Extra: {extra}" for extra in self.provides_extra]
        lines += [f"Requires-Dist: {req}" for req in self.requires_dist]
        return "\n".join(lines) + "\n"

    def entry_points_text(self) -> str:
        chunks = []
        for group in sorted(self.entry_points):
            body = "".join(f"{name} = {target}\n" for name, target in sorted(self.entry_points[group].items()))
            chunks.append(f"[{group}]\n{body}")
        return "\n".join(chunks)


# ----------------------------------------------------------------------------------------
# Writing any wheel
# ----------------------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _zip_info(arcname: str, executable: bool = False) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(arcname, date_time=ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # Unix, so the mode below is honoured
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    return info


def write_wheel(
    out_dir: Path,
    meta: WheelMetadata,
    files: Mapping[str, bytes | Path],
    *,
    top_level: list[str] | None = None,
) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` into ``out_dir``; return its path.

    ``files`` maps archive paths (``pkg/mod.py``) to bytes or to a file to read. The file is
    built in memory and written atomically (``launchers.atomic``), so a reader never sees half a wheel.
    """
    dist_info = f"{meta.file_stem}.dist-info"
    contents: dict[str, tuple[bytes, bool]] = {}
    for arcname, source in files.items():
        if arcname.startswith("/") or ".." in arcname.split("/") or arcname.startswith(dist_info + "/"):
            raise ValueError(f"bad path in wheel: {arcname!r}")
        if isinstance(source, Path):
            contents[arcname] = (source.read_bytes(), os.access(source, os.X_OK))
        else:
            contents[arcname] = (source, False)
    metadata_files = {
        f"{dist_info}/METADATA": meta.metadata_text(),
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if meta.entry_points:
        metadata_files[f"{dist_info}/entry_points.txt"] = meta.entry_points_text()
    if top_level:
        metadata_files[f"{dist_info}/top_level.txt"] = "".join(f"{name}\n" for name in sorted(top_level))

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{meta.file_stem}-py3-none-any.whl"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        ordered = [(name, *contents[name]) for name in sorted(contents)]
        ordered += [(name, text.encode("utf-8"), False) for name, text in sorted(metadata_files.items())]
        for arcname, data, executable in ordered:
            zf.writestr(_zip_info(arcname, executable), data)
            writer.writerow([arcname, _record_hash(data), len(data)])
        writer.writerow([f"{dist_info}/RECORD", "", ""])
        zf.writestr(_zip_info(f"{dist_info}/RECORD"), record.getvalue().encode("utf-8"))
    return write_atomic(target, archive.getvalue(), 0o644)


# ----------------------------------------------------------------------------------------
# mlaunch's own files and metadata
# ----------------------------------------------------------------------------------------


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise UserError(f"cannot find the package {name!r} to put in the wheel; is mlaunch installed?")
    return Path(locations[0])


def _wanted(path: Path) -> bool:
    return not path.name.startswith(".") and not path.name.endswith(_SKIP_SUFFIXES)


def _walk(root: Path, prefix: str) -> dict[str, Path]:
    """Every file under ``root`` (subpackages and data included), minus caches and editor debris."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
        )
        rel = Path(dirpath).relative_to(root)
        for filename in filenames:
            path = Path(dirpath) / filename
            if _wanted(path) and path.is_file():
                found["/".join([prefix, *rel.parts, filename])] = path
    return found


def package_files() -> dict[str, Path]:
    """Archive path → file on disk for every file of mlaunch's import packages."""
    files: dict[str, Path] = {}
    for package in IMPORT_PACKAGES:
        files.update(_walk(_package_dir(package), package))
    files.update(_walk(_package_dir(TEMPLATES_PACKAGE), TEMPLATES_PACKAGE.replace(".", "/")))
    return files


def _source_pyproject() -> Path | None:
    """``pyproject.toml`` of the checkout ``launchers`` is imported from, if it describes mlaunch."""
    candidate = _package_dir("launchers").parent / "pyproject.toml"
    return candidate if candidate.is_file() else None


def _with_extra(requirement: str, extra: str) -> str:
    req, _, marker = requirement.partition(";")
    marker = marker.strip()
    condition = f'extra == "{extra}"'
    return f"{req.strip()}; ({marker}) and {condition}" if marker else f"{req.strip()}; {condition}"


def _metadata_from_pyproject(path: Path) -> WheelMetadata | None:
    try:
        import tomllib
    except ImportError:  # Python 3.10: fall back to the installed distribution's metadata
        return None
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if project.get("name") != DIST_NAME:
        return None
    extras = project.get("optional-dependencies", {})
    license_field = project.get("license")
    entry_points = {group: dict(points) for group, points in project.get("entry-points", {}).items()}
    if project.get("scripts"):
        entry_points["console_scripts"] = dict(project["scripts"])
    return WheelMetadata(
        name=project["name"],
        version=str(project.get("version") or _package_version()),
        summary=project.get("description", ""),
        requires_python=project.get("requires-python"),
        license=license_field.get("text") if isinstance(license_field, dict) else license_field,
        requires_dist=[*project.get("dependencies", []), *(_with_extra(r, e) for e in extras for r in extras[e])],
        provides_extra=list(extras),
        entry_points=entry_points,
    )


def _metadata_from_installed() -> WheelMetadata:
    from importlib import metadata

    try:
        dist = metadata.distribution(DIST_NAME)
    except metadata.PackageNotFoundError:
        raise UserError(
            "cannot find mlaunch's metadata: neither a pyproject.toml beside the `launchers` package nor an "
            "installed `mlaunch` distribution (pip install mlaunch-*.whl, or pip install -e . in a checkout)"
        ) from None
    md = dist.metadata

    def first(key: str) -> str | None:
        values = md.get_all(key) or []
        return str(values[0]) if values else None

    entry_points: dict[str, dict[str, str]] = {}
    for ep in dist.entry_points:
        entry_points.setdefault(ep.group, {})[ep.name] = ep.value
    return WheelMetadata(
        name=first("Name") or DIST_NAME,
        version=first("Version") or _package_version(),
        summary=first("Summary") or "",
        requires_python=first("Requires-Python"),
        license=first("License"),
        requires_dist=list(md.get_all("Requires-Dist") or []),
        provides_extra=list(md.get_all("Provides-Extra") or []),
        entry_points=entry_points,
    )


def _package_version() -> str:
    from launchers import __version__

    return __version__


def mlaunch_metadata() -> WheelMetadata:
    """From the checkout's pyproject.toml when there is one, else from the installed distribution."""
    pyproject = _source_pyproject()
    meta = _metadata_from_pyproject(pyproject) if pyproject else None
    if meta is None:
        meta = _metadata_from_installed()
    scripts = meta.entry_points.setdefault("console_scripts", {})
    for name, target in DEFAULT_SCRIPTS.items():
        scripts.setdefault(name, target)
    return meta


def build_mlaunch_wheel(out_dir: Path) -> Path:
    """Write mlaunch's wheel into ``out_dir`` (created if missing); return the wheel's path."""
    files = package_files()
    missing = [
        name
        for name in ("launchers/__init__.py", "launchers/cli/main.py", "bootstrap/__init__.py")
        if name not in files
    ]
    if missing:
        raise UserError(f"the installed mlaunch looks incomplete: {', '.join(missing)} not found")
    if not any(name.endswith(".j2") for name in files):
        raise UserError("no templates (*.j2) found in launchers.templates; the wheel could not render scripts")
    try:
        return write_wheel(out_dir, mlaunch_metadata(), files, top_level=list(IMPORT_PACKAGES))
    except OSError as exc:
        raise UserError(f"cannot write the wheel into {out_dir}: {exc.strerror or exc}") from None
