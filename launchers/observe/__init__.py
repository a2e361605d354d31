"""Seeing the job: what each rank is doing, who is slow, what happened, and where the time went.

- ``steps``: samples the ranks' progress files (``launchers.elastic.ipc.progress``) into per-rank
  step, rate, own time per step and committed checkpoint;
- ``straggler``: a rank whose own time per step is ``monitor.straggler_factor`` × the job's median
  for ``monitor.straggler_steps`` steps is reported once, and again when it recovers;
- ``events_log``: ``<log_dir>/events.jsonl``, one JSON object per event;
- ``status_file``: ``<log_dir>/status.json``, what ``mlaunch status`` shows;
- ``goodput``: the end-of-run report (productive step time against wall time, and the losses);
- ``phases``: long waits say what they wait for instead of being silent;
- ``observer``: the glue the runner calls (attempt started, tick, attempt ended, run ended).
"""
