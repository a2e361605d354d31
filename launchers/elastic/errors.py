"""The error every rank of a failed save or load raises alike (its own module: resume and checkpoint both raise it)."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A save that did not commit (on every rank), or a checkpoint that cannot be read."""
