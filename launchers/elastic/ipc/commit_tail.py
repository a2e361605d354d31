"""What every save path does around its commit: staging an image, and the steps after the marker.

``Checkpointer.stage``/``save`` and the DCP plug-in (``MlaunchStorageWriter``) write the same
layout with the same commit protocol (``layout.commit``); what follows a commit — finish the
renames of a save killed after its marker, rotate to ``keep``, the status the grace budget and
``mlaunch status`` read, the progress file's committed step, the line that says it — lives here
once, as does handing an encoded image to this rank's shared-memory slot.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from launchers.elastic.format import layout, shardfile
from launchers.elastic.ipc import device_stage, progress, rank_segment
from launchers.elastic.ranks import collective


def stage_image(
    rank: int, world: int, root: Path, keep: int, step: int, enc: shardfile.Encoded, *, overlap: bool = False
) -> bool:
    """``enc`` into this rank's slot for mlaunch's flash save; False when not staged.

    An image with tensors still on an accelerator is copied without blocking (``device_stage``;
    ``overlap``: the compute stream waits for the copy at the next optimizer step, not at once).

    Not under mlaunch nobody would read it; a slot that cannot be reserved (a full /dev/shm)
    switches staging off with a warning (``rank_segment.disable``) instead of failing training.
    """
    seg = rank_segment.process_segment(rank, world)
    if seg is None:
        return False
    try:
        seg.set_target(str(root), keep)
        if enc.on_device:
            device_stage.process_stager(overlap).stage(seg, step, enc)
        else:
            seg.stage(step, enc)
    except (OSError, ValueError, BufferError) as exc:
        rank_segment.disable(f"{type(exc).__name__}: {exc}")
        return False
    return True


def after_commit(
    root: Path, keep: int, step: int, *, rank: int, world: int, coordinator: bool, seconds: float, size: int, path: Path
) -> None:
    """After ``step`` was committed to ``path``: the coordinator tidies, every caller reports."""
    if coordinator:
        with contextlib.suppress(OSError):
            layout.finish_renames(root, before=step)  # a save killed after its commit
            layout.rotate(root, keep)
    rank_segment.update_status(rank, world, saving_step=-1, committed_step=step, save_seconds=seconds, save_bytes=size)
    progress.saved(seconds, step)  # the goodput report's checkpoint stalls, the status view's step
    if coordinator:
        collective.say(f"committed step {step} to {path} in {seconds:.2f}s")
