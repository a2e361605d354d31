"""The documented limits on every input: job.yaml's size and shape, counts, world size, durations.

One place, so the loader, the model, the platform readers, the README and the fuzz suite agree.
The world-size maximum is what plans in bounded time (a simulated plan builds every rank).
"""

from __future__ import annotations

MAX_JOB_FILE_BYTES = 1024 * 1024  # job.yaml: 1 MiB
MAX_YAML_DEPTH = 64  # nested mappings/sequences in job.yaml
MAX_YAML_NODES = 50_000  # values in job.yaml once aliases are expanded
MAX_NUMBER_CHARS = 24  # characters of one integer or float literal in job.yaml
MAX_NODES = 65_536  # nodes:, platform node counts
MAX_PROCS_PER_NODE = 1_024  # procs_per_node:, platform processes per node
MAX_WORLD_SIZE = 1_048_576  # nodes × processes per node (ranks in total), rank-table devices: 65,536 × 16
MAX_SIMULATED_RANKS = 4_096  # a local simulation plans and starts every rank on this one machine
MAX_COUNT = 1_000_000  # restarts, checkpoints kept, sink size and other plain counts
MAX_DURATION = 365 * 86_400.0  # seconds: any duration in job.yaml (one year)
MAX_JSON_BYTES = 128 * 1024 * 1024  # a rank table file (65,536 servers × 16 devices is ~80 MB) or TF_CONFIG
MAX_JSON_DEPTH = 64  # nested objects/arrays in a rank table or TF_CONFIG
