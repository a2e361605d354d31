"""A peer node's one process: hold the node for node 0's mpirun until this node's mlaunch stops it.

``python -m bootstrap.peer --node0 HOST --runtime-dir DIR`` — what the MPI engine plans on
every node but node 0. The ranks here are started by node 0's mpirun through this node's
sshd; this process only stands for them under the supervisor. The job's control plane
(``launchers.control``) tells this node's mlaunch how the job ended — node 0's exit code,
a failure to restart from, a lost node 0 — and mlaunch stops this process (SIGTERM) and exits
with the job's code.

When it exits, for whatever reason, it stops this node's sshd and every session under it
(the ``orted`` and ranks node 0's mpirun started here), so a stopped node leaves nothing. It
also ends with its parent (a parent-death signal), should its mlaunch vanish.

Exit code: 128+N when stopped by signal N (the code mlaunch reports is the job's, not this).
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from pathlib import Path

from bootstrap.runtime import NodeFiles
from bootstrap.sshd import stop
from launchers import log
from launchers.prctl import die_with_parent

say = functools.partial(log.say, who="mlaunch peer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bootstrap.peer", description=__doc__)
    parser.add_argument("--node0", default="node 0", help="node 0's name, for messages")
    parser.add_argument(
        "--runtime-dir", type=Path, help="this node's runtime directory: its sshd (and sessions) stop when we exit"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    # Gone with its mlaunch, and by SIGTERM (not the supervisor's SIGKILL): sshd is stopped on the way out.
    die_with_parent(signal.SIGTERM)
    say(f"holding this node for {args.node0}'s mpirun; the job's output is on node 0")
    try:
        while not received:
            signal.pause()
    finally:
        if args.runtime_dir is not None:
            # The ranks node 0 started here run under this node's sshd: they stop with this node.
            stop(NodeFiles(args.runtime_dir))
    return 128 + received[0]


if __name__ == "__main__":
    sys.exit(main())
