"""The agent's commit tail, once: commit a written step, rotate, or drop what will not be committed.

mlaunch writes a step's shards itself in three places — the flash save after a failure
(``flash_save``), the background persist while training runs (``background_persist``) and the
survivors' save after a node loss (``survivor_save``). Each writes its node's shards into a
temporary directory of its own (``step_N.flash-<key>.tmp``, ``.bg-<key>.tmp``,
``.replica-a<attempt>.tmp``), and node 0 commits it with the protocol every save uses
(``layout.commit``: sizes checked, marker last, then the rename). What follows is the same for
the three, and lives here: prune to the newest ``keep`` (failing to prune never undoes a
commit), and — for a directory that will not be committed — remove it on node 0, but only this
node's shards elsewhere (node 0 may be committing that very directory).

The in-training saves (``Checkpointer.save``/``stage`` and the DCP plug-in) share their own tail
in ``launchers.elastic.ipc.commit_tail``: it also reports to the rank's status and progress,
which the agent does not have.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launchers.elastic.format import layout


def commit_step(
    tmp: Path, root: Path, step: int, world: int, sizes: dict[int, int], *, keep: int, **manifest: Any
) -> Path:
    """Commit ``tmp`` as ``step`` under ``root`` (``layout.commit``), then keep the newest ``keep``.

    Raises ``OSError`` when the step cannot be committed (a missing or short shard, a full
    disk); the caller then discards ``tmp``. Returns the committed directory.
    """
    final = layout.commit(tmp, root / layout.step_name(step), step, world, sizes, **manifest)
    with contextlib.suppress(OSError):
        layout.rotate(root, keep)
    return final


def discard(tmp: Path, *, coordinator: bool, shards: Iterable[int]) -> None:
    """Remove an uncommitted directory: all of it on node 0 (``coordinator``), else this node's ``shards``."""
    if coordinator:
        layout.remove_tree(tmp)
        return
    for index in shards:
        with contextlib.suppress(OSError):
            (tmp / layout.shard_name(index)).unlink()
