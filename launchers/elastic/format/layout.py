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
directory.

Lineage: a marker records the line of training it continues — ``lineage`` (the id of the commit
the job resumed from, or a fresh start's token) and ``resumed_step`` (that commit's step; -1 for
a fresh start). A job that resumed from step k and commits step n > k ends every *other*
lineage's steps above k: they are another branch of training, abandoned when this one was taken
up. Such a commit is **superseded** (``superseded``): readers ignore it, the next rotation
removes it, and a save of the same step by the newer lineage replaces it (the replaced one stays
until the new marker is written; between the two, the newer commit time wins).

Directories without a marker are stale partial saves; they are removed before a
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

from launchers.elastic.storage.durable import fsync_dir

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

    @property
    def lineage(self) -> str | None:
        value = self.manifest.get("lineage")
        return str(value) if value is not None else None

    @property
    def resumed_step(self) -> int | None:
        value = self.manifest.get("resumed_step")
        return int(value) if isinstance(value, int) else None

    @property
    def time(self) -> float:
        value = self.manifest.get("time")
        return float(value) if isinstance(value, (int, float)) else 0.0

    def ends(self, other: Committed) -> bool:
        """Committing ``self`` abandoned ``other``: a later commit of another lineage that resumed before it."""
        return _ends(self.lineage, self.resumed_step, self.time, other)

    def shard(self, rank: int) -> Path:
        entry = self.manifest.get("shards", {}).get(str(rank))
        return self.path / (entry["file"] if isinstance(entry, dict) and "file" in entry else shard_name(rank))


def _ends(lineage: str | None, resumed_step: int | None, when: float, other: Committed) -> bool:
    if lineage is None or resumed_step is None or lineage == other.lineage:
        return False
    return when > other.time and resumed_step < other.step


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


def _all_committed(root: Path) -> list[Committed]:
    """Every directory with a valid marker for its step (twins and superseded ones included)."""
    found = []
    for step, is_tmp, path in _step_dirs(root):
        manifest = read_marker(path)
        if manifest is not None and int(manifest["step"]) == step:
            found.append((Committed(step, path, manifest), is_tmp))
    found.sort(key=lambda pair: (pair[0].step, pair[0].time, not pair[1]))
    return [item for item, _ in found]


def superseded(items: list[Committed]) -> list[Committed]:
    """The commits another lineage ended (see the module docstring)."""
    return [c for c in items if any(d.ends(c) for d in items)]


def committed(root: Path) -> list[Committed]:
    """Every committed checkpoint under ``root`` that no newer lineage ended, newest step first (one per step).

    Of two commits of one step (a replaced one and its replacement, or a committed ``.tmp`` and its
    renamed twin), the newer commit wins, and the final name when they are the same commit.
    """
    items = _all_committed(root)
    ended = {id(c) for c in superseded(items)}
    found: dict[int, Committed] = {}
    for item in items:  # sorted by (step, time, final name last): the last one of a step wins
        if id(item) not in ended:
            found[item.step] = item
    return [found[s] for s in sorted(found, reverse=True)]


def newest_step(root: Path) -> int | None:
    items = committed(root)
    return items[0].step if items else None


def newest_for(root: Path, lineage: str | None, resumed_step: int | None) -> int | None:
    """The newest committed step a commit of ``lineage`` (resumed at ``resumed_step``) would not end."""
    now = time.time() + 1.0
    items = [c for c in committed(root) if not _ends(lineage, resumed_step, now, c)]
    return items[0].step if items else None


def lineage_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """The lineage a shard's metadata names (what a commit of it records), for mlaunch's own commits."""
    return {k: meta[k] for k in ("lineage", "resumed_step") if meta.get(k) is not None}


def image_lineage(image: Any) -> dict[str, Any]:
    """``lineage_fields`` of a shard image's header (staged memory); {} when it cannot be read."""
    from launchers.elastic.format import shardfile

    try:
        return lineage_fields(shardfile.read_header(image)["meta"])
    except (ValueError, KeyError, TypeError):
        return {}


def same_lineage(manifest: dict[str, Any] | None, lineage: str | None) -> bool:
    """A committed step's manifest continues ``lineage`` (unknown lineages count as the same: nothing to replace)."""
    if manifest is None:
        return False
    theirs = manifest.get("lineage")
    return lineage is None or theirs is None or str(theirs) == lineage


def partial_dirs(root: Path, after: int | None = None) -> list[Path]:
    """Step directories without a valid marker (stale partial saves); only steps > ``after`` if given."""
    return [path for step, _, path in _step_dirs(root) if (after is None or step > after) and read_marker(path) is None]


def remove_tree(path: Path) -> None:
    """Remove a checkpoint directory: its marker first, so it can never look complete half-deleted."""
    with contextlib.suppress(OSError):
        (path / MARKER).unlink()
    shutil.rmtree(path, ignore_errors=True)


def clean_partial(
    root: Path, newer_than: float | None = None, spare: set[Path] | frozenset[Path] = frozenset()
) -> list[Path]:
    """Remove stale partial step directories (and the agent's exchange area); returns what went.

    ``spare``: directories being written right now (mlaunch's commit beside an in-place recovery).
    """
    removed = []
    for path in partial_dirs(root):
        if path in spare:
            continue
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
    if same_lineage(read_marker(final), extra.get("lineage")):
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
    """Delete committed checkpoints beyond the newest ``keep``, and those a newer lineage ended; the steps removed."""
    if keep < 1:
        return []
    everything = _all_committed(root)
    current = committed(root)
    kept_steps = {c.step for c in current[:keep]}
    ended = {id(c) for c in superseded(everything)}
    removed = []
    for item in everything:
        if item.step in kept_steps and id(item) not in ended:
            continue  # a kept step (or its not-yet-renamed twin: finish_renames settles it)
        remove_tree(item.path)
        removed.append(item.step)
    return sorted(set(removed))


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
