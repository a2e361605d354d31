"""Node health check: how long the whole check takes, and how often it names the right bad host.

H hosts are network namespaces on this machine (``tests/netns.py``); each runs its own
``mlaunch health`` the ModelArts way (node 0 hosts the control plane and prints the table).

- **time**: healthy hosts, for 2, 3 and 4 hosts: the wall time from starting every mlaunch
  to the last one's exit (process start, imports, control plane, probes, links, verdict),
  and the check's own figure from health.json (node 0: from the start of the check to the verdict),
  split into the slowest node's phases: arrive (importing torch, waiting for every node),
  probes (memory, storage, compute turns), links;
- **localisation**: ``--trials`` runs on ``--nodes`` hosts, each with one random bad host,
  rate-limited (``tc tbf 20mbit`` on its eth0) or CPU-starved (a cgroup with 15 % of a CPU),
  picked at random; a trial counts when health.json names exactly that host.

    python benchmarks/health_check.py                       # time on 2, 3, 4 hosts; 10 trials on 4
    python benchmarks/health_check.py --trials 3 --nodes 3

Needs root (network namespaces, tc, cgroups) and torch; it removes everything it creates.
The machine's cores are shared: figures taken while other work runs are noisy.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def one_check(count: int, fault: str | None = None, bad: int = -1) -> tuple[float, dict, list[int]]:
    """Wall seconds, health.json and the exit codes of one check on ``count`` fresh hosts."""
    import contextlib

    from health_faults import finish, slow_link, start, starved_cgroup, write_job
    from netns import NetnsHosts

    with NetnsHosts(count) as net, tempfile.TemporaryDirectory(prefix="health-bench-") as tmp:
        job = write_job(Path(tmp), count, "{on_failure: fail, timeout: 90s}")
        if fault == "link":
            slow_link(net.hosts[bad])
        cgroup = starved_cgroup(15) if fault == "cpu" else contextlib.nullcontext(None)
        with cgroup as procs_file:
            began = time.monotonic()
            starved = {bad: procs_file} if procs_file is not None else None
            results = finish(start(net.hosts, job, ["health"], starved=starved), timeout=240)
            took = time.monotonic() - began
        doc = json.loads((Path(tmp) / "logs" / "health.json").read_text())
        names = {h.hostname: h.index for h in net.hosts}
        for node in doc["nodes"]:
            node["host_index"] = names.get(node["host"], -1)
        return took, doc, [rc for rc, _, _ in results]


def timing(sizes: list[int], repeat: int) -> None:
    print(f"whole check, healthy hosts ({repeat} run(s) each; median):")
    head = f"{'hosts':>6}{'wall (start→exit)':>20}{'check itself':>15}"
    print(f"{head}{'arrive':>9}{'probes':>9}{'links':>8}{'bad named':>11}")
    for count in sizes:
        walls, checks, bad = [], [], 0
        phases: dict[str, list[float]] = {"arrive": [], "probes": [], "links": []}
        for _ in range(repeat):
            took, doc, _codes = one_check(count)
            walls.append(took)
            checks.append(doc["seconds"])
            for name, values in phases.items():  # the slowest node's
                values.append(max(n["phases"][name] for n in doc["nodes"]))
            bad += len(doc["bad_hosts"])
            for n in doc["nodes"]:
                if n["verdict"] != "ok":
                    print(f"  false alarm on {count} healthy hosts: host {n['host_index']}: {n['reason']}")
        split = "".join(
            f"{statistics.median(phases[name]):>{w}.1f}s" for name, w in (("arrive", 8), ("probes", 8), ("links", 7))
        )
        print(f"{count:>6}{statistics.median(walls):>19.1f}s{statistics.median(checks):>14.1f}s{split}{bad:>11}")


def localisation(count: int, trials: int, seed: int) -> None:
    rng = random.Random(seed)
    hits = 0
    print(f"localisation on {count} hosts, {trials} trial(s), one random bad host each:")
    for trial in range(trials):
        fault, bad = rng.choice(["link", "cpu"]), rng.randrange(count)
        took, doc, codes = one_check(count, fault, bad)
        named = sorted(n["host_index"] for n in doc["nodes"] if n["verdict"] != "ok")
        hit = named == [bad]
        hits += hit
        reasons = "; ".join(f"{n['host_index']}: {n['reason']}" for n in doc["nodes"] if n["verdict"] != "ok")
        verdict = "ok" if hit else "MISS"
        print(f"  trial {trial}: {fault:<4} on host {bad}: named {named} {verdict} ({took:.1f}s) {reasons}")
    print(f"localisation accuracy: {hits}/{trials}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,3,4", help="host counts to time (comma-separated)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per host count")
    parser.add_argument("--nodes", type=int, default=4, help="hosts in each localisation trial")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=16)
    args = parser.parse_args()

    from netns import netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the clean-up (namespaces, cgroup) must still run
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    if args.sizes:
        timing([int(s) for s in args.sizes.split(",")], args.repeat)
    if args.trials:
        localisation(args.nodes, args.trials, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
