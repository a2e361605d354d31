"""A peer node's one process: wait for node 0's word on how the job ended, exit with it.

``python -m bootstrap.peer --listen HOST --port P --key-file K --job NAME --attempt N
--first-contact S --node0-timeout S`` — what the MPI engine plans on every node but node 0
(the ranks here are started by node 0's mpirun through this node's sshd). See
``bootstrap.completion`` for the protocol.

When it exits, for whatever reason, it stops this node's sshd and every session under it
(the ``orted`` and ranks node 0's mpirun started here), so a stopped node leaves nothing.

Exit code: the job's, as node 0 reports it; ``1`` when node 0 never connected within
``--first-contact`` seconds or fell silent for ``--node0-timeout`` seconds; 128+N when this
process is stopped by signal N.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import time
from pathlib import Path

from bootstrap.completion import EXIT_NODE0_LOST, Listener, bind_listener
from bootstrap.keys import completion_secret
from bootstrap.runtime import NodeFiles
from bootstrap.sshd import local_addresses_of, stop
from launchers import log

say = functools.partial(log.say, who="mlaunch peer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bootstrap.peer", description=__doc__)
    parser.add_argument("--listen", default="", help="this node's host name (listen on its address only)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key-file", type=Path, required=True, help="the job's private key (HMAC key source)")
    parser.add_argument("--job", required=True)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--node0", default="node 0", help="node 0's name, for messages")
    parser.add_argument("--first-contact", type=float, required=True, help="seconds node 0 has to connect")
    parser.add_argument("--node0-timeout", type=float, required=True, help="silence after which node 0 is gone")
    parser.add_argument(
        "--runtime-dir", type=Path, help="this node's runtime directory: its sshd (and sessions) stop when we exit"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    signal.signal(signal.SIGHUP, lambda signum, frame: sys.exit(128 + signum))
    try:
        secret = completion_secret(args.key_file)
    except OSError as exc:
        say(f"cannot read the job key {args.key_file}: {exc.strerror}")
        return 2
    addresses = local_addresses_of(args.listen) if args.listen else []
    try:
        sock = bind_listener(addresses, args.port)
    except OSError as exc:
        say(f"cannot listen on port {args.port} for node 0's completion signal: {exc.strerror or exc}")
        return 1
    where = sock.getsockname()[0]
    say(f"waiting for {args.node0} (completion channel on {where}:{args.port}); the job's output is on node 0")
    listener = Listener(sock, secret, args.job, args.attempt)
    start = time.monotonic()
    reason: list[str] = []

    def node0_gone() -> bool:
        now = time.monotonic()
        if listener.last_contact is None:
            if now - start > args.first_contact:
                reason.append(f"{args.node0} never connected within {args.first_contact:g}s")
                return True
            return False
        if listener.links == 0 and now - listener.last_contact > args.node0_timeout:
            reason.append(f"lost {args.node0}: no word from it for {args.node0_timeout:g}s")
            return True
        if listener.links > 0 and now - listener.last_contact > args.node0_timeout:
            reason.append(f"{args.node0} stopped sending heartbeats {args.node0_timeout:g}s ago")
            return True
        return False

    try:
        listener.serve(until=node0_gone)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        sock.close()
        if args.runtime_dir is not None:
            # The ranks node 0 started here run under this node's sshd: when this node stops
            # (signal, node 0 gone, or job over), they stop with it.
            stop(NodeFiles(args.runtime_dir))
    if listener.code is not None:
        say(f"{args.node0} reports the job ended with exit code {listener.code}")
        return listener.code
    say(f"{reason[0] if reason else 'node 0 is gone'}; exiting with {EXIT_NODE0_LOST}")
    return EXIT_NODE0_LOST


if __name__ == "__main__":
    sys.exit(main())
