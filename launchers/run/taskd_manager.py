"""The TaskD manager side process that mlaunch runs beside node 0's training processes.

MindCluster's guide has users write a ``manager.py`` and start it in the background on
rank 0 (``python manager.py &``). mlaunch starts this module instead, as a supervised
process (``launchers.engines.high_availability`` adds it to node 0's plan): it calls
``taskd.api.init_taskd_manager({"job_id", "node_nums", "proc_per_node"})`` and
``start_taskd_manager()``, then stays alive until SIGTERM/SIGINT — which the supervisor
sends once the training processes are done, or when the job is stopped. A manager that
fails to start exits non-zero, which stops the job (TaskD was asked for).

``start_taskd_manager`` may block (the manager's service loop) or return at once; it runs
in a daemon thread so either way the main thread answers SIGTERM promptly.

Standard library (and ``launchers.log``) only besides ``taskd`` itself: run it as
``python -m launchers.run.taskd_manager --job-id ID --node-nums N --proc-per-node P``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from launchers.log import say

WHO = "taskd-manager"  # the prefix of this process's messages


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launchers.run.taskd_manager", description=__doc__.splitlines()[0])
    parser.add_argument("--job-id", default=None, help="MindCluster job id; default $MINDX_TASK_ID")
    parser.add_argument("--node-nums", type=int, required=True, help="nodes in the job")
    parser.add_argument("--proc-per-node", type=int, required=True, help="training processes per node")
    args = parser.parse_args(argv)
    if args.node_nums < 1 or args.proc_per_node < 1:
        parser.error("--node-nums and --proc-per-node must be ≥ 1")
    args.job_id = args.job_id or os.environ.get("MINDX_TASK_ID") or os.environ.get("MLAUNCH_JOB_NAME") or "job"
    return args


def run(args: argparse.Namespace) -> int:
    """Init and start the manager, then wait for a stop signal; the exit code says how it went."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        from taskd.api import init_taskd_manager, start_taskd_manager
    except ImportError as exc:
        say(f"cannot import taskd.api ({exc}); install MindCluster's TaskD wheel in this interpreter", who=WHO)
        return 2
    config = {"job_id": args.job_id, "node_nums": args.node_nums, "proc_per_node": args.proc_per_node}
    if not init_taskd_manager(config):
        say(f"init_taskd_manager({config}) failed", who=WHO)
        return 1
    outcome: dict[str, object] = {}

    def start() -> None:
        try:
            outcome["ok"] = bool(start_taskd_manager())
        except Exception as exc:  # reported by the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=start, name="taskd-manager", daemon=True)
    thread.start()
    say(f"started for job {args.job_id}: {args.node_nums} nodes × {args.proc_per_node} processes", who=WHO)
    while not stop.wait(0.2):
        if "error" in outcome or outcome.get("ok") is False:
            say(f"start_taskd_manager failed: {outcome.get('error', 'returned False')}", who=WHO)
            return 1
    say("stopping (signal received)", who=WHO)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    code = run(parse_args(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    # TaskD may leave non-daemon threads behind; they must not keep a stopped manager alive.
    os._exit(code)


if __name__ == "__main__":
    main()
