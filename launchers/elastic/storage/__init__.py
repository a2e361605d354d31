"""Storage: how a checkpoint's bytes reach the disk and survive a crash, whoever writes them.

- ``durable``: a file created, filled in chunks under a deadline, written back early, fsynced,
  and removed again when any of that fails; a directory fsynced after the entries it gained;
- ``direct_io``: large writes past the page cache (``O_DIRECT``), with the buffered fallback.

Bytes only: nothing here knows what a shard holds (``format``), nor who asked for the write (a
rank's own save, or mlaunch's agent persisting a staged slot). Standard library only; it imports
nothing else of ``launchers`` (``tests/test_layout.py``).
"""
