"""Warm standbys: ranks that are already imported when a restart needs them.

One warm parent per node imports ``preload:`` once and forks each standby (``warm_parent``,
``warm_parent_handle``); the pool keeps one standby per worker and hands it a rank's spec at a
restart (``standby_pool``, ``standby``); the preload list learns what the ranks import
(``preload_learning``, reading the ranks' ``launchers.elastic.ipc.import_report``). The supervisor
(``launchers.run``) takes standbys from the pool; nothing here supervises.
"""
