"""Ranks: what a rank knows of the job it runs in, and how it agrees with the other ranks.

- ``env``: what mlaunch's environment tells a rank (rank, world size, run id, restart attempt,
  the shared-memory directory, checkpoints to keep), read in one place;
- ``collective``: the few integer collectives graceful exit needs, over whichever framework the
  script initialised (torch.distributed, MindSpore), or none; the ``mlaunch.elastic[rank N]`` line.

The bottom of the training side: every other room may use it, it uses none of them (only
``launchers.log``). Standard library only at import: frameworks are found in ``sys.modules``.
"""
