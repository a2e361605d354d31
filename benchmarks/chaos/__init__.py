"""The chaos storm harness (issue 35): a seeded storm of every fault class on network-namespace hosts.

``python -m benchmarks.chaos`` (``__main__``) runs it. Its parts, each with one job:

- ``schedule``: the faults, a pure function of the seed;
- ``worker``: the training job mlaunch runs on every host (a script: its lines are the protocol);
- ``observe``: one mlaunch per host, their lines parsed and stamped;
- ``inject``: one real action per fault class, and what undoes it;
- ``storm``: one run of the job: start, inject, observe, end;
- ``report``: the figures, a pure function of what the runs saw;
- ``png``: the picture, drawn by mlaunch's own timeline (``mlaunch timeline``).
"""
