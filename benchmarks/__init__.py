"""Timing goals, each measured against a baseline in the same run (``docs/benchmarks.md``).

Most benchmarks are one script each, ``benchmarks/NAME.py``. A harness of several modules
is a package, imported by its full name with the repository root on ``sys.path``:
``benchmarks.chaos`` (``python -m benchmarks.chaos``) and ``benchmarks.recovery`` (the worker and
the modes of ``fault_recovery.py``, and what they share with ``fault_burst.py``).
"""
