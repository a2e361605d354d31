"""How planning an Ascend job grows with the rank table: up to 16,384 servers × 16 devices (262,144 ranks).

For each size it writes a generated version-1.0 table, then times what one platform node does
before starting anything: read the JSON, validate it (unique ranks 0..N-1, devices, servers),
find this server (``MA_CURRENT_HOST_IP`` names the *last* server: the worst case), and plan
its 16 processes — through the engine's real ``detect`` + ``plan``. It also times planning
every rank of the table at once (what ``--simulate`` does for nodes × devices).

Printed: the best of ``--repeat`` runs per size, the growth against the previous size
(time ratio / size ratio: ~1.0 means linear), and whether the top size meets the 1 s target.

    python benchmarks/plan_scale.py [--repeat 3] [--sizes 1024,4096,16384] [--all-ranks]

Planning every rank at once (a simulation) is timed only with ``--all-ranks``: a simulation
runs at most 4,096 ranks, so that column is for growth only. mlaunch accepts up to 1,048,576
ranks (65,536 nodes × 16); the 1 s target is for the top size.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from launchers.config.job import parse_job
from launchers.engines.ascend import ENGINE
from launchers.platform.ranktable import generate_rank_table, load_rank_table, simulated_server_id

DEVICES = 16
TARGET_S = 1.0


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="1024,4096,16384", help="server counts, comma-separated")
    parser.add_argument("--all-ranks", action="store_true", help="also time planning every rank (a simulation)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="mlaunch-plan-scale-") as tmp:
        root = Path(tmp)
        (root / "train.py").write_text("print('hi')\n")
        job = parse_job("entry: train.py\nengine: ascend\n", root / "job.yaml")
        print(
            f"{'servers':>8} {'ranks':>7} {'file MB':>8} {'load+validate':>14} {'node plan':>10} "
            f"{'growth':>7} {'all-rank plan':>14} {'growth':>7}"
        )
        previous: tuple[int, float, float] | None = None
        results = []
        for servers in sizes:
            path = root / f"hccl_{servers}.json"
            path.write_text(json.dumps(generate_rank_table(servers, DEVICES)))
            env = {"RANK_TABLE_FILE": str(path), "MA_CURRENT_HOST_IP": simulated_server_id(servers - 1)}
            load = best_of(args.repeat, lambda p=path: load_rank_table(p))

            def node_plan(env=env, servers=servers):
                cluster = ENGINE.detect(job, env, [])
                plan = ENGINE.plan(job, cluster)
                assert len(plan.processes) == DEVICES and plan.world_size == servers * DEVICES

            node = best_of(args.repeat, node_plan)
            everything = float("nan")
            if args.all_ranks:
                cluster = ENGINE.detect(job, env, [])
                cluster.base.simulated = True  # plan every server's processes, as local simulation does

                def all_plan(cluster=cluster, servers=servers):
                    assert len(ENGINE.plan(job, cluster).processes) == servers * DEVICES

                everything = best_of(max(1, args.repeat - 1), all_plan)
            if previous:
                scale = servers / previous[0]
                growth, growth_all = (node / previous[1]) / scale, (everything / previous[2]) / scale
                g1, g2 = f"{growth:7.2f}", f"{growth_all:7.2f}"
            else:
                g1 = g2 = f"{'-':>7}"
            mb = path.stat().st_size / 1e6
            print(
                f"{servers:>8} {servers * DEVICES:>7} {mb:>8.1f} {load:>13.3f}s {node:>9.3f}s {g1} "
                f"{everything:>13.3f}s {g2}",
                flush=True,
            )
            previous = (servers, node, everything)
            results.append((servers, node))
    top_servers, top = results[-1]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak memory of this process: {peak:.0f} MiB (the largest table, parsed)")
    verdict = "meets" if top <= TARGET_S else "MISSES"
    print(f"\nnode plan at {top_servers} servers × {DEVICES} devices: {top:.3f}s — {verdict} the {TARGET_S:g}s target")
    return 0 if top <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
