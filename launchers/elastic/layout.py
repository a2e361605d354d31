"""The on-disk checkpoint layout and its commit protocol, shared by ranks and by mlaunch's agent.

::

    <dir>/step_00000012/            committed: renamed from step_00000012.tmp after the marker
        rank_0.mlck  rank_1.mlck ...  one shard per rank (``shardfile`` images)
        COMMITTED                   the marker: JSON manifest, written last
    <dir>/step_00000013.tmp/        a save in progress, or one that died: no marker → ignored
    <dir>/step_00000013.flash-<key>.tmp/   the agent's persist of staged memory (same rules)

A checkpoint is complete exactly when its directory holds a valid ``COMMITTED`` marker.
The marker is written only after every shard is written and fsynced (tmp file + fsync +
rename + fsync of the directory), and lists every shard with its size; a reader checks
them. The rename of the directory to its final name happens after the marker and is only
cosmetic: a ``*.tmp`` directory that already holds a valid marker counts as committed (a
crash between the two steps loses nothing).

Resume takes the newest step with a valid marker — never merely the highest-numbered
directory. Directories without a marker are stale partial saves; they are removed before a
name is reused and when a run starts. Keeping the last *k*: older committed steps lose
their marker first, then their files, so a half-deleted checkpoint never looks complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.elastic.durable import fsync_dir

MARKER = "COMMITTED"
_STEP_DIR = re.compile(r"^step_(\d+)(?:\.(?!tmp$)[A-Za-z0-9_-]+)?(\.tmp)?$")  # ".tmp" alone is no suffix


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def shard_name(rank: int, ext: str = ".mlck") -> str:
    """``rank_R.mlck`` (the shard format); other frameworks' own files keep their extension."""
    return f"rank_{rank}{ext}"


@dataclass
class Committed:
    """A committed checkpoint: its step, directory and manifest."""

    step: int
    path: Path
    manifest: dict[str, Any]

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])

    @property
    def id(self) -> str:
        return str(self.manifest.get("id", ""))

    def shard(self, rank: int) -> Path:
        entry = self.manifest.get("shards", {}).get(str(rank))
        return self.path / (entry["file"] if isinstance(entry, dict) and "file" in entry else shard_name(rank))


def parse_step(name: str) -> tuple[int, bool] | None:
    """(step, is_tmp) for a checkpoint directory name, None for anything else."""
    match = _STEP_DIR.match(name)
    if not match:
        return None
    return int(match.group(1)), bool(match.group(2))


def _step_dirs(root: Path) -> list[tuple[int, bool, Path]]:
    """(step, is_tmp, path) of every checkpoint directory in ``root`` (none when it cannot be read)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    found = []
    for entry in entries:
        parsed = parse_step(entry.name)
        if parsed is not None and entry.is_dir(follow_symlinks=False):
            found.append((*parsed, Path(entry.path)))
    return found


def read_marker(path: Path) -> dict[str, Any] | None:
    """The manifest of ``path`` if its marker is valid and every shard it lists has its size."""
    try:
        manifest = json.loads((path / MARKER).read_text())
        shards = manifest["shards"]
        world = int(manifest["world_size"])
        int(manifest["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(shards, dict) or not shards or world < 1:
        return None
    for entry in shards.values():
        try:
            if (path / entry["file"]).stat().st_size != int(entry["bytes"]):
                return None
        except (OSError, KeyError, TypeError, ValueError):
            return None
    return dict(manifest)


def committed(root: Path) -> list[Committed]:
    """Every committed checkpoint under ``root``, newest step first (one entry per step)."""
    found: dict[int, Committed] = {}
    for step, is_tmp, path in _step_dirs(root):
        manifest = read_marker(path)
        if manifest is None or int(manifest["step"]) != step:
            continue
        if step in found and is_tmp:
            continue  # the final name wins over a committed-but-not-renamed twin
        found[step] = Committed(step, path, manifest)
    return [found[s] for s in sorted(found, reverse=True)]


def newest_step(root: Path) -> int | None:
    items = committed(root)
    return items[0].step if items else None


def partial_dirs(root: Path, after: int | None = None) -> list[Path]:
    """Step directories without a valid marker (stale partial saves); only steps > ``after`` if given."""
    return [path for step, _, path in _step_dirs(root) if (after is None or step > after) and read_marker(path) is None]


def remove_tree(path: Path) -> None:
    """Remove a checkpoint directory: its marker first, so it can never look complete half-deleted."""
    with contextlib.suppress(OSError):
        (path / MARKER).unlink()
    shutil.rmtree(path, ignore_errors=True)


def clean_partial(root: Path, newer_than: float | None = None) -> list[Path]:
    """Remove stale partial step directories (and the agent's exchange area); returns what went."""
    removed = []
    for path in partial_dirs(root):
        if newer_than is not None:
            with contextlib.suppress(OSError):
                if path.stat().st_mtime > newer_than:
                    continue
        remove_tree(path)
        removed.append(path)
    flash = root / ".flash"
    if flash.exists() and newer_than is None:
        shutil.rmtree(flash, ignore_errors=True)
    return removed


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """tmp file + fsync + rename + fsync of the directory."""
    tmp = path.with_name(path.name + f".{os.getpid()}.part")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def commit(
    tmp: Path, final: Path, step: int, world_size: int, sizes: dict[int, int], *, ext: str = ".mlck", **extra: Any
) -> Path:
    """Write the marker into ``tmp`` (the commit point), then rename it to ``final``.

    ``sizes`` maps every rank to its shard size; a missing rank is an error, as is a shard
    whose size on disk differs (when this process can see it: on storage shared by every
    node it can). Returns the directory that now holds the committed checkpoint.
    """
    if sorted(sizes) != list(range(world_size)):
        missing = sorted(set(range(world_size)) - set(sizes))
        raise OSError(f"cannot commit step {step}: no shard from rank(s) {missing}")
    for rank, size in sizes.items():
        with contextlib.suppress(FileNotFoundError):
            on_disk = (tmp / shard_name(rank, ext)).stat().st_size
            if on_disk != size:
                raise OSError(f"cannot commit step {step}: rank {rank}'s shard has {on_disk} bytes, expected {size}")
    fsync_dir(tmp)
    manifest = {
        "step": step,
        "world_size": world_size,
        "shards": {str(r): {"file": shard_name(r, ext), "bytes": sizes[r]} for r in sorted(sizes)},
        "id": uuid.uuid4().hex,
        "time": time.time(),
        "host": socket.gethostname(),
        **extra,
    }
    write_json_atomic(tmp / MARKER, manifest)
    # committed; now give it its final name (cosmetic, see the module docstring)
    if read_marker(final) is not None:
        remove_tree(tmp)  # someone (the agent or the ranks) committed this step first
        return final
    if final.exists():
        remove_tree(final)  # a stale directory without marker under the final name
    try:
        os.rename(tmp, final)
    except OSError:
        if read_marker(final) is not None:
            remove_tree(tmp)
            return final
        return tmp  # still committed under the .tmp name
    fsync_dir(final.parent)
    return final


def rotate(root: Path, keep: int) -> list[int]:
    """Delete committed checkpoints beyond the newest ``keep``; returns the steps removed."""
    if keep < 1:
        return []
    removed = []
    for item in committed(root)[keep:]:
        remove_tree(item.path)
        removed.append(item.step)
    return removed


def finish_renames(root: Path, before: int) -> list[Path]:
    """Rename committed ``step_N.tmp`` of steps < ``before`` to ``step_N`` (a save killed after its commit).

    A save killed between writing the marker and the rename leaves a committed directory
    under its temporary name: it counts (``committed``), and the next successful save, run
    by rank 0 after every rank is done reading, finishes the rename (or drops the twin when
    ``step_N`` exists too), so no temporary directory outlives that save. Only the names
    ``save`` uses: mlaunch's agent renames its own ``.flash-*.tmp`` directories.
    """
    done = []
    for step, is_tmp, path in _step_dirs(root):
        if not is_tmp or step >= before or path.name != step_name(step) + ".tmp" or read_marker(path) is None:
            continue
        final = root / step_name(step)
        with contextlib.suppress(OSError):
            if read_marker(final) is not None:
                remove_tree(path)
            else:
                if final.exists():
                    remove_tree(final)
                os.rename(path, final)
                fsync_dir(root)
            done.append(path)
    return done
