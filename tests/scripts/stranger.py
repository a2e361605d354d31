"""A stranger on the job's network attacking node 0's control port (issue 47): run it on a host of its own.

    python stranger.py HOST PORT JOB_NAME SECONDS

Without the job's MLAUNCH_JOB_SECRET it tries what anyone on the network could, all at once:
200 connections held open without a word; raw garbage; a ZMTP peer without CURVE sending a
message sealed with the key derived from the job's public facts (``wire.job_secret``: the name,
the master address, the port); a CURVE peer with keys derived from those facts; a 128 MiB frame
after a valid ZMTP greeting; and for SECONDS a flood of new connections sending random bytes.
It prints what it did, one ``stranger: <what> <count>`` line each.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time

import zmq

from launchers.control.transport import curve_keys, secure_agent
from launchers.control.wire import job_secret, seal

HELD = 200
GREETING_NULL = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31


def connect(host: str, port: int, timeout: float = 2.0) -> socket.socket | None:
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None


def wait_open(host: str, port: int, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        probe = connect(host, port, 0.5)
        if probe is not None:
            probe.close()
            return
        time.sleep(0.1)
    raise SystemExit(f"stranger: {host}:{port} never opened")


def hold(host: str, port: int, seconds: float, done: dict[str, int]) -> None:
    held = [s for s in (connect(host, port) for _ in range(HELD)) if s is not None]
    done["held"] = len(held)
    time.sleep(seconds)
    for s in held:
        s.close()


def huge_frame(host: str, port: int, done: dict[str, int]) -> None:
    """A ZMTP 3.0 greeting (NULL), then a long frame announcing 128 MiB and as much of it as is taken."""
    s = connect(host, port)
    if s is None:
        return
    sent = 0
    try:
        s.sendall(GREETING_NULL + b"\x02" + (128 << 20).to_bytes(8, "big"))
        chunk = os.urandom(1 << 20)
        for _ in range(128):
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    finally:
        s.close()
    done["huge_bytes_sent"] = sent


def forged(host: str, port: int, job: str, done: dict[str, int]) -> None:
    """Messages sealed with the key anyone can derive, over NULL and over CURVE with keys derived from it."""
    guessed = job_secret(job, host, port, {})
    context = zmq.Context()
    sent = 0
    for keys in (None, curve_keys(guessed)):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            secure_agent(sock, keys, 2)
        sock.connect(f"tcp://{host}:{port}")
        for message in ({"t": "hello", "node": 1, "host": "x"}, {"t": "end", "node": 0, "code": 3}):
            for _ in range(20):
                try:
                    sock.send_multipart(seal(guessed, message), zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
                time.sleep(0.02)
        sock.close()
    context.term()
    done["forged_sent"] = sent


def flood(host: str, port: int, seconds: float, done: dict[str, int]) -> None:
    end, connections, garbage = time.monotonic() + seconds, 0, os.urandom(64 << 10)
    while time.monotonic() < end:
        s = connect(host, port, 0.5)
        if s is None:
            continue
        connections += 1
        with contextlib.suppress(OSError):
            s.sendall(garbage)
        s.close()
    done["flood_connections"] = connections


def main() -> None:
    host, port, job, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    wait_open(host, port)
    done: dict[str, int] = {}
    threads = [
        threading.Thread(target=hold, args=(host, port, 6.0, done)),
        threading.Thread(target=huge_frame, args=(host, port, done)),
        threading.Thread(target=forged, args=(host, port, job, done)),
        threading.Thread(target=flood, args=(host, port, seconds, done)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for what, count in sorted(done.items()):
        print(f"stranger: {what} {count}", flush=True)


if __name__ == "__main__":
    main()
