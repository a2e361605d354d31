"""Keys that only one engine reads, checked once the engine is known (``--engine`` wins over job.yaml's).

The model cannot check them: which engine runs is decided after loading. A key of another engine's
section is normally harmless (one job.yaml may serve several engines), except where it would change
what this engine does without saying so.
"""

from __future__ import annotations

from launchers.config.loader import key_error
from launchers.config.model import Job


def check_engine_keys(job: Job, engine: str) -> None:
    """Exit 2 (file, line and key named) for a key this engine must not be given.

    ``mpi.node0_timeout`` is the MPI engine's older name of ``monitor.node_timeout``; with another
    engine it would silently set the control plane's node timeout (``launchers.control.node_timeout``).
    """
    if engine != "pytorch" and job.pytorch.nnodes and ":" in job.pytorch.nnodes:
        raise key_error(
            job,
            ["pytorch", "nnodes"],
            f"an elastic node range ({job.pytorch.nnodes}) is run by the pytorch engine only: engine {engine} "
            "cannot re-form its job at another size; remove the range or run with --engine pytorch",
        )
    if engine != "mpi" and "node0_timeout" in job.mpi.model_fields_set:
        raise key_error(
            job,
            ["mpi", "node0_timeout"],
            f"the MPI engine's older name of monitor.node_timeout; engine {engine} does not read it: "
            "set monitor.node_timeout instead",
        )
