"""IPC: the files in shared memory through which a rank and its node's mlaunch agent talk.

- ``staging``: the rank's two-slot segment of staged shard images, which the agent persists
  after a fault (flash save), and the save status it reads;
- ``progress``: progress reports for hang and straggler detection, and the stack-dump signal;
- ``completion``: "this rank finished training";
- ``import_report``: the modules a rank imported, which the warm standbys learn to preload;
- ``commit_tail``: what every save path tells the agent around a commit (an image into the
  slot; after the marker: rotate, status, committed step, the line that says it).

Both sides import these modules: the ranks write, mlaunch (``launchers.run``, ``persist``,
``standby``) reads. So they stay cheap to import and framework-free, and stand on ``format``,
``storage`` and ``ranks`` only (``tests/test_layout.py``). Nothing is imported here: mlaunch
imports ``ipc.staging`` on every start and pays for that module alone.
"""
