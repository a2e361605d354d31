"""The agent's half of checkpointing: what mlaunch itself writes of the state the ranks staged.

The ranks' half is ``launchers.elastic`` (the format, ``Checkpointer``, staging into shared
memory). Here, beside it: the flash save after a rank dies (``flash_save``, ``flash_hook``),
the background persist (``background_persist``), copying a live slot (``slot_copy``), how much
of the grace period a dying save needs (``grace_budget``), and machine-loss replication — a
node's newest slot in a buddy's memory, and the survivors' commit after a node is lost
(``replication``, ``peer_copy``, ``replica_store``, ``replica_plan``, ``survivor_save``).
Nothing here supervises processes (``launchers.run``) or starts standbys (``launchers.standby``).
"""
