"""DCP: ``torch.distributed.checkpoint`` reading and writing mlaunch's checkpoint layout.

- ``writer``: ``MlaunchStorageWriter`` for ``dcp.save``/``dcp.async_save`` (into ``step_N.tmp/``
  and committed as ``Checkpointer.save`` commits, or staged into the rank's slot);
- ``reader``: ``MlaunchStorageReader`` for ``dcp.load``, resharded by DCP's planner;
- ``catalog``: a committed checkpoint's shard headers stated as DCP ``Metadata``.

Users reach the plug-ins through ``launchers.elastic.pytorch`` (``MlaunchStorageReader``,
``MlaunchStorageWriter``) and ``Checkpointer.load_latest(into=)``. Importing them imports
``torch.distributed.checkpoint`` (~0.6 s), so this package imports none of its modules; nothing
below the facade (``format``, ``storage``, ``ipc``, ``ranks``) imports it (``tests/test_layout.py``).
"""
