"""128 real mlaunch agents on this machine (issue 24 item 5): a restart together, and a node's mlaunch killed.

One mlaunch per node, ModelArts-style arguments on 127.0.0.1 (``tests/many_agents.py``), one
light rank each (no torch), ``monitor.node_timeout: 5s``:

1. rank 64 is SIGKILLed in attempt 0: printed, the time from its death until every node's
   rank of attempt 1 started (every node restarted together), and every exit code (all 0);
2. node 64's mlaunch is SIGKILLed: the time until each other mlaunch exited (median, max)
   against ``node_timeout + 5 s``, whether each exit was non-zero and named node 64, and any
   process left running.

Before issue 24 the same run measured 8.0 s and 11.1 s (two cores, load ~80). Heavy: 128
mlaunch processes and their ranks on two cores; figures taken while other work runs are noisy.

    python benchmarks/real_agents.py [--nodes 128]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from many_agents import NODE_TIMEOUT, Agents, job_port, leftovers, start  # noqa: E402

STARTUP = 600.0  # seconds for every mlaunch to start its rank (128 interpreters on two cores)


def event_times(agents: Agents, event: str, after: float) -> list[float]:
    """Seconds after ``after`` at which each node logged ``event`` in the shared events.jsonl."""
    path = agents.home / "logs" / "events.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(r["time"] - after for r in records if r.get("event") == event and r["time"] >= after)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s median, {max(values):.1f} s max" if values else "none"


def restart_together(home: Path, count: int) -> tuple[float, dict[int, int], Agents]:
    kill = count // 2
    agents = start(home, count, job_port(), KILL_RANK=str(kill), RUN="600", RUN_AGAIN="2")
    try:
        if len(agents.wait_started(0, STARTUP)) < count:
            raise RuntimeError(f"only {len(agents.started(0))} of {count} ranks started")
        (agents.marks / "go").write_text("go\n")
        again = agents.wait_started(1, 120)
        killed = float((agents.marks / "killed").read_text())
        codes = agents.wait_exits(120)
    finally:
        agents.kill_all()
    took = max(again.values()) - killed if len(again) == count else float("nan")
    return took, codes, agents


def node_killed(home: Path, count: int) -> tuple[list[float], dict[int, int], Agents, float]:
    victim = count // 2
    agents = start(home, count, job_port(), RUN="600")
    try:
        if len(agents.wait_started(0, STARTUP)) < count:
            raise RuntimeError(f"only {len(agents.started(0))} of {count} ranks started")
        time.sleep(1.0)
        killed = time.time()
        os.kill(agents.procs[victim].pid, signal.SIGKILL)  # the mlaunch alone (its rank dies with it)
        codes = agents.wait_exits(NODE_TIMEOUT + 60)
    finally:
        agents.kill_all()
    took = [agents.exited[n] - killed for n in agents.exited if n != victim]
    return took, codes, agents, killed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    args = parser.parse_args()
    count = args.nodes
    with tempfile.TemporaryDirectory(prefix="mlaunch-real-agents-") as tmp:
        took, codes, agents = restart_together(Path(tmp) / "restart", count)
        zero = sum(1 for code in codes.values() if code == 0)
        print(
            f"{count} agents, rank {count // 2} killed: every node restarted {took:.1f} s later; {zero}/{count} exit 0"
        )
        restart = event_times(agents, "restart", float((agents.marks / "killed").read_text()))
        print(f"  every node met to restart (events.jsonl 'restart' after the kill): {spread(restart)}")
        left = leftovers(agents.home)
        took_list, codes, agents, killed = node_killed(Path(tmp) / "lost", count)
        victim = count // 2
        others = [n for n in range(count) if n != victim]
        named = sum(1 for n in others if codes.get(n, 0) != 0 and f"node {victim}" in agents.stderr(n))
        bound = NODE_TIMEOUT + 5
        print(
            f"{count} agents, node {victim}'s mlaunch killed: the others exited after "
            f"{statistics.median(took_list):.1f} s (median), {max(took_list):.1f} s "
            f"(max; bound node_timeout + 5 = {bound:g} s: "
            f"{'met' if max(took_list) <= bound else 'NOT met'}); {named}/{len(others)} non-zero naming node {victim}"
        )
        learned = event_times(agents, "failure", killed)
        print(f"  each learned of the loss and stopped its rank (events.jsonl 'failure'): {spread(learned)}")
        left += leftovers(agents.home)
        print(f"left running: {len(left)}" + ("".join(f"\n  {line}" for line in left) if left else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
