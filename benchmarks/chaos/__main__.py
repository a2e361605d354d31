"""A thousand faults: a chaos storm of every fault class on network-namespace hosts (issue 35).

A job on ``--hosts`` network-namespace hosts × ``--nproc`` ranks (DDP over gloo on the hosts'
``eth0``, ``pytorch.nnodes: "MIN:HOSTS"``, warm standbys, every step staged, a background commit
every ``--persist-every`` steps, ``elastic: {grow: at_checkpoint, last_call: 10s}``, the checkpoint directory on a
small tmpfs) runs through a seeded schedule drawn from every class (``schedule.py``: kill -9
of a rank, of a standby, of a node's mlaunch; a hang; a link down past ``node_timeout`` and a
flap under it; a node that comes back; SIGTERM to one node and to all; node 0 lost; a full
disk; a slow node), one fault every ``--spacing`` s on average, a share ``--nested`` landing
inside the previous fault's recovery. The same job then runs without faults, in the same
invocation, to the same last step: its step time is the yardstick, and when the schedule never
changes the membership (``--same-membership``) its final parameters must equal the storm's bit for bit — the
exit status is 1 when they differ (``docs/benchmarks.md``: DDP's bucket layout was why they once did).

Prints the table and writes ``--out`` (JSON) and a PNG timeline next to it (``png.py``).
Needs root (network namespaces, a tmpfs, a cgroup). ``report.py`` says what each figure means.
Run from the repository root (``python benchmarks/chaos ...`` works from anywhere):

    python -m benchmarks.chaos --faults 30 --seed 35            # a short storm, every class
    python -m benchmarks.chaos --faults 300 --seed 35 --out docs/chaos.json
    python -m benchmarks.chaos --faults 20 --same-membership     # final parameters == fault-free run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # netns
sys.path.insert(0, str(ROOT))  # benchmarks.*, and launchers from this checkout

from netns import NetnsHosts, netns_unavailable_reason  # noqa: E402

from benchmarks.bench_env import compile_sources, platform_free_env  # noqa: E402
from benchmarks.chaos.inject import Injector  # noqa: E402
from benchmarks.chaos.observe import Cluster  # noqa: E402
from benchmarks.chaos.png import draw as draw_png  # noqa: E402
from benchmarks.chaos.report import build, table  # noqa: E402
from benchmarks.chaos.schedule import CLASSES, SAME_MEMBERSHIP, draw  # noqa: E402
from benchmarks.chaos.storm import Storm  # noqa: E402
from launchers.elastic.format import layout  # noqa: E402

WORKER = HERE.parent / "worker.py"
PRELOAD = "[torch, torch.distributed, torch.nn.parallel, torch._dynamo, launchers.elastic]"


def write_job(work: Path, name: str, args: argparse.Namespace, ckpt: Path) -> Path:
    job = work / f"{name}.yaml"
    job.write_text(
        f"name: chaos-{name}\nentry: {WORKER}\nargs: ['--step-time', '{args.step_time}']\n"
        f"nodes: {args.hosts}\nprocs_per_node: {args.nproc}\nlog_dir: {work / name / 'logs'}\n"
        f"preload: {PRELOAD}\n"
        f"checkpoint: {{dir: {ckpt}, grace_period: 10s, persist_every: {args.persist_every}, keep: 3}}\n"
        "restart: {max_restarts: 100000, backoff: 0s}\n"
        f"monitor: {{node_timeout: {args.node_timeout:g}s, hang_timeout: {args.hang_timeout:g}s, start_timeout: 30s}}\n"
        f"pytorch: {{nnodes: '{args.min_nodes}:{args.hosts}'}}\nelastic: {{grow: at_checkpoint, last_call: 10s}}\n"
    )
    return job


def leftovers(cluster: Cluster, ckpt: Path) -> dict[str, Any]:
    """What is left once every mlaunch ended: processes in each host, shared memory, partial checkpoints."""
    time.sleep(1.0)
    procs, shm = {}, {}
    for index, host in enumerate(cluster.hosts):
        pids = host.pids()
        procs[index] = [
            Path(f"/proc/{p}/cmdline").read_bytes()[:120].decode(errors="replace")
            for p in pids
            if Path(f"/proc/{p}").exists()
        ]
        shm[index] = sorted(p.name for p in cluster.shm_dir(index).glob("*")) if cluster.shm_dir(index).exists() else []
    partial = [p.name for p in layout.partial_dirs(ckpt)] if ckpt.exists() else []
    for index in range(len(cluster.hosts)):  # the harness's own per-host directory, once counted
        if cluster.shm_dir(index).exists() and not shm[index]:
            cluster.shm_dir(index).rmdir()
    return {
        "processes": sum(len(v) for v in procs.values()),
        "shm": sum(len(v) for v in shm.values()),
        "partial": len(partial),
        "detail": {"processes": procs, "shm": shm, "partial": partial},
    }


def run_job(
    args: argparse.Namespace, net: NetnsHosts, work: Path, name: str, faults: list, end: int | None
) -> dict[str, Any]:
    ckpt = work / "fs" / name
    ckpt.mkdir(parents=True)
    (work / name).mkdir()
    hang = work / name / "hang"
    hang.mkdir()
    base = platform_free_env()
    base.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", BENCH_CKPT_DIR=str(ckpt), BENCH_HANG_DIR=str(hang))
    base.update(BENCH_END=str(work / name / "end"))
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH", "")]))
    cluster = Cluster(net.hosts, write_job(work, name, args, ckpt), base, args.nproc, work / name)
    injector = Injector(cluster, work / "fs", hang, random.Random(args.seed + 1), node_timeout=args.node_timeout)
    storm = Storm(cluster, injector, ckpt, work / name / "end", faults, args.node_timeout, end_step=end)
    if args.deadline is not None:
        storm.deadline = time.monotonic() + args.deadline
    try:
        rec = storm.run()
    finally:
        injector.run_undo()
        cluster.stop()
    out = {k: getattr(rec, k) for k in ("events", "faults", "exits", "restarts", "unrecoverable", "end_step", "said")}
    out["leftovers"] = leftovers(cluster, ckpt)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=30)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--spacing", type=float, default=5.0, help="mean seconds between faults")
    parser.add_argument("--nested", type=float, default=0.2, help="share of faults inside the previous one's recovery")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--min-nodes", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--persist-every", type=int, default=10)
    parser.add_argument("--node-timeout", type=float, default=3.0)
    parser.add_argument("--hang-timeout", type=float, default=6.0)
    parser.add_argument("--same-membership", action="store_true", help="only classes that keep the membership")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the fault-free run (tests: no ratios, only what was lost)"
    )
    parser.add_argument(
        "--deadline", type=float, default=None, help="seconds: a storm still running then is cut, counted unrecoverable"
    )
    parser.add_argument("--out", type=Path, default=None, help="the JSON report (the PNG goes next to it)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run's logs in this directory")
    args = parser.parse_args()
    compile_sources()  # off the measured path: no mlaunch or rank compiles what it imports
    reason = netns_unavailable_reason()
    if reason:
        print(f"chaos: cannot make network-namespace hosts: {reason}", file=sys.stderr)
        return 2
    classes = SAME_MEMBERSHIP if args.same_membership else CLASSES
    faults = draw(
        args.seed,
        args.faults,
        spacing=args.spacing,
        nested=args.nested,
        hosts=args.hosts,
        min_nodes=args.min_nodes,
        node_timeout=args.node_timeout,
        classes=classes,
    )
    shape = f"{len(faults)} faults, {args.hosts} hosts × {args.nproc} ranks"
    print(f"chaos: seed {args.seed}, {shape}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    work = Path(tempfile.mkdtemp(prefix="chaos-", dir=args.keep))
    (work / "fs").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(work / "fs")], check=True)
    try:
        with NetnsHosts(args.hosts) as net:
            storm = run_job(args, net, work, "storm", faults, None)
            end = storm["end_step"]
            base_end = end if args.same_membership else min(end or 200, 200)
            baseline = {"events": []} if args.no_baseline else run_job(args, net, work, "baseline", [], base_end)
    finally:
        subprocess.run(["umount", "-l", str(work / "fs")], check=False)
    report = build(storm, baseline, min_nodes=args.min_nodes, spacing=args.spacing, seed=args.seed)
    report["schedule"] = [f.as_dict() for f in faults]
    report["args"] = {k: str(v) for k, v in vars(args).items()}
    report["work"] = str(work)
    print(table(report), flush=True)
    out = args.out or work / "chaos.json"
    if out.is_dir():  # a folder given for the report: the report goes in it (a 30-minute storm ended on this)
        out = out / "chaos.json"
    raw = {"storm": storm, "baseline": baseline}
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out.with_suffix(".raw.json")).write_text(json.dumps(raw, default=lambda o: getattr(o, "__dict__", str(o))) + "\n")
    done = [f for f in storm["faults"] if "done" in f]
    draw_png(out.with_suffix(".png"), work / "storm" / "logs", done, storm["restarts"])
    print(f"chaos: report {out}, timeline {out.with_suffix('.png')}", flush=True)
    return 0 if passed(report, compared=args.same_membership and not args.no_baseline) else 1


def passed(report: dict[str, Any], *, compared: bool) -> bool:
    """Nothing unrecoverable, no committed step lost and, for a same-membership storm run with its fault-free twin,
    final parameters equal to the twin's (a difference, or a run that printed no final digest, fails it)."""
    if report["unrecoverable"] or report["committed_steps_lost"] != 0:
        return False
    if compared and report.get("final_equal_to_fault_free") is not True:
        print("chaos: FAIL: the final parameters differ from the fault-free run's (or one printed none)", flush=True)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
