"""Format: one rank's shard file and the checkpoint directory that holds the shards.

- ``shardfile``: the shard image (magic, JSON header, raw blob bytes), the same bytes in shared
  memory and on disk; ``shard_encode`` splits a state into that header and its blobs;
- ``plain``: the state's skeleton as JSON (nothing that runs code on load); ``tensors``: a tensor's
  bytes read safely, and a DTensor's local shard with where it lies in the whole;
- ``layout``: ``step_N/`` directories, the ``COMMITTED`` marker written last, rotation.

Both halves read this room: the ranks (``Checkpointer``, the DCP plug-in) and mlaunch's agent
(flash save, background persist), which never imports torch. It stands on ``storage`` alone: no
collective, no shared memory, no DCP (``tests/test_layout.py``).
"""
