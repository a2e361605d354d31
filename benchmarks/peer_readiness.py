"""Peer readiness: how long node 0 waits until every host's sshd accepts the job key.

H hosts are network namespaces on this machine (``tests/netns.py``), each with the job's
sshd (generated config, job-wide host key). Host 0 checks every host, itself included, the
way node 0 of an MPI job does — a real SSH handshake and public-key login (paramiko) per
host — in three ways, measured in the same run:

- **single**: one host alone (``bootstrap.readiness.wait_for_peers([host])``), for every
  host; the slowest of these is the floor no method can beat;
- **concurrent**: all H hosts at once with one deadline (what mlaunch does);
- **serial**: one host after the other, each retried with ``sleep 1`` until it answers —
  the structure of the seed's ``run_mpi.sh`` loop (there: ``ping`` and a TCP probe; here the
  same SSH check as the others, so only the scheduling differs).

Two scenarios: **warm** (every sshd already up: pure checking cost) and **staggered boot**
(host i's sshd starts ``i × --stagger`` seconds after the clock starts, as peers of a real
job come up at different times). The figure of merit is concurrent / slowest single;
target ≤ 1.2.

    python benchmarks/peer_readiness.py                 # 8 hosts, stagger 0.25 s, 3 repeats
    python benchmarks/peer_readiness.py --hosts 16 --stagger 0.1

Needs root (network namespaces) and openssh-server; it removes everything it creates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PORT = 36666


# ----------------------------------------------------------------------------------------
# Measuring (runs inside host 0's namespace)
# ----------------------------------------------------------------------------------------


def boot(spec: dict, delays: list[float]) -> list[threading.Thread]:
    """Start host i's sshd ``delays[i]`` seconds from now (in its namespace)."""
    from bootstrap import sshd
    from bootstrap.runtime import NodeFiles

    binary = sshd.sshd_binary() or "sshd"
    start = time.monotonic()

    def one(host: dict, delay: float) -> None:
        time.sleep(max(0.0, start + delay - time.monotonic()))
        layout = NodeFiles(Path(host["dir"]))
        trace(f"start sshd {host['ip']}")
        subprocess.run(
            ["ip", "netns", "exec", host["ns"], binary, "-f", str(layout.sshd_config), "-E", str(layout.sshd_log)],
            check=True,
        )

    pairs = zip(spec["hosts"], delays, strict=True)
    threads = [threading.Thread(target=one, args=(host, delay), daemon=True) for host, delay in pairs]
    for thread in threads:
        thread.start()
    return threads


def trace(message: str) -> None:
    """``PEER_READINESS_TRACE=FILE``: append what the measuring process does, as it happens."""
    path = os.environ.get("PEER_READINESS_TRACE")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{time.monotonic():.3f} {threading.current_thread().name} {message}\n")


def stop_all(spec: dict) -> None:
    from bootstrap import sshd
    from bootstrap.runtime import NodeFiles

    for host in spec["hosts"]:
        trace(f"stop {host['ip']}: {sshd.stop(NodeFiles(Path(host['dir'])))}")


def serial_seed_style(addresses: list[str], check: object, timeout: float = 60) -> None:
    """One host at a time; each retried after ``sleep 1`` until it answers (run_mpi.sh's loop)."""
    deadline = time.monotonic() + timeout
    for address in addresses:
        while True:
            try:
                check(address)  # type: ignore[operator]
                break
            except Exception as exc:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"serial loop: {address} never answered: {exc}") from None
                time.sleep(1)


def measure(spec: dict) -> dict:
    from bootstrap import readiness

    user = spec["user"]
    first = Path(spec["hosts"][0]["dir"])
    pkey = readiness.load_client_key(first / "id_ed25519")
    host_key = readiness.load_pinned_host_key(first / "known_hosts")
    addresses = [h["ip"] for h in spec["hosts"]]
    # Peers come up in no particular order: a fixed shuffle of 0, stagger, 2 × stagger, ...
    boot_order = [i * spec["stagger"] for i in range(len(addresses))]
    random.Random(6).shuffle(boot_order)
    trace(f"boot delays {boot_order}")
    scenarios = {"warm": [0.0] * len(addresses), "staggered boot": boot_order}

    def concurrent(targets: list[str]) -> None:
        readiness.wait_for_peers(targets, PORT, user, pkey, host_key, 60)

    def check(address: str) -> None:
        readiness.check_once(address, PORT, user, pkey, host_key, 5)

    results: dict = {}
    for scenario, delays in scenarios.items():
        warm = scenario == "warm"

        def timed(run: object, delays: list[float] = delays, warm: bool = warm) -> float:
            stop_all(spec)
            threads = boot(spec, delays)
            if warm:
                for thread in threads:
                    thread.join()
            start = time.monotonic()
            run()  # type: ignore[operator]
            elapsed = time.monotonic() - start
            for thread in threads:
                thread.join()
            return elapsed

        row: dict = {"single": [], "concurrent": [], "serial": []}
        for repeat in range(spec["repeat"]):
            trace(f"{scenario} {repeat}: single")
            row["single"].append([timed(lambda a=a: concurrent([a])) for a in addresses])
            trace(f"{scenario} {repeat}: concurrent")
            row["concurrent"].append(timed(lambda: concurrent(addresses)))
        trace(f"{scenario}: serial")
        row["serial"].append(timed(lambda: serial_seed_style(addresses, check)))
        results[scenario] = row
    stop_all(spec)
    return results


# ----------------------------------------------------------------------------------------
# Orchestration (root namespace)
# ----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--stagger", type=float, default=0.25, help="seconds between two hosts' sshd start")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(json.loads(Path(args.measure).read_text()))))
        return 0

    from netns import NetnsHosts, netns_unavailable_reason

    from bootstrap import keys, sshd
    from bootstrap.runtime import NodeFiles, runtime_root

    reason = netns_unavailable_reason()
    if reason or sshd.sshd_binary() is None:
        print(f"skipped: {reason or 'sshd is not installed'}")
        return 0
    # SIGTERM/SIGHUP (timeout, a closed terminal) must still run the clean-up below.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    tag = secrets.token_hex(3)
    work = Path(tempfile.mkdtemp(prefix="peer-readiness-"))
    dirs = [runtime_root(os.environ) / f"bench-readiness-{tag}-node{i}" for i in range(args.hosts)]
    try:
        keys.generate(work / "secret")
        with NetnsHosts(args.hosts) as net:
            spec = {"user": sshd.current_user(), "stagger": args.stagger, "repeat": args.repeat, "hosts": []}
            for host, directory in zip(net.hosts, dirs, strict=True):
                layout = NodeFiles(directory)
                keys.install(work / "secret", layout)
                keys.write_private(
                    layout.sshd_config, sshd.render_config(layout, PORT, [host.ip], sshd.current_user()).encode()
                )
                spec["hosts"].append({"ns": host.ns, "ip": host.ip, "dir": str(directory)})
            (work / "spec.json").write_text(json.dumps(spec))
            if os.geteuid() == 0:
                sshd.PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
            run = net.hosts[0].run(
                [sys.executable, str(HERE), "--measure", str(work / "spec.json")], cwd=str(ROOT), timeout=1200
            )
            if run.returncode != 0:
                print(run.stdout, run.stderr, file=sys.stderr)
                return 1
            report(json.loads(run.stdout.strip().splitlines()[-1]), args)
    finally:
        for directory in dirs:
            sshd.stop(NodeFiles(directory))
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(results: dict, args: argparse.Namespace) -> None:
    print(f"peer readiness: {args.hosts} hosts (network namespaces), real sshd + paramiko login, {args.repeat} repeats")
    print(f"{'scenario':<16}{'slowest single':>16}{'concurrent':>12}{'ratio':>8}{'serial (seed)':>15}{'ratio':>8}")
    for scenario, row in results.items():
        slowest = statistics.median(max(run) for run in row["single"])
        concurrent = statistics.median(row["concurrent"])
        serial = statistics.median(row["serial"])
        print(
            f"{scenario:<16}{slowest:>15.3f}s{concurrent:>11.3f}s{concurrent / slowest:>7.2f}x"
            f"{serial:>14.3f}s{serial / slowest:>7.2f}x"
        )
    print("ratio = time / slowest single host's time; target for concurrent: <= 1.2x")


if __name__ == "__main__":
    sys.exit(main())
