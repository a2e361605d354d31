"""The fault-recovery benchmarks' parts: ``python benchmarks/fault_recovery.py`` runs them.

- ``worker``: the training job mlaunch and torchrun run (a script: its lines are read by ``harness``);
- ``harness``: what every mode shares (the worker's lines, a launcher read line by line, its
  environment, the figures); it imports no benchmark;
- ``hosts``: ``--hosts 2``, kill -9 and hangs across network-namespace hosts, against torchrun;
- ``membership``: ``--hosts 3 --membership``, a host lost and back (``pytorch.nnodes: "2:3"``).

``fault_recovery.py`` (one host, and the command line of every mode) and ``fault_burst.py`` import
them; nothing here imports either, so the modes form no import cycle.
"""
