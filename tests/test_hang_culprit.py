"""Issue 25 item 1: when a hang is declared, the rank that is *not* waiting in a collective is named first.

The hang users meet: one rank stuck in its own code (``tests/scripts/hang_rounds.py`` sleeps at
its SLEEPS HERE line) while its peers block in the next gloo all-reduce, wrapped in
``elastic.waiting()`` as the PyTorch example wraps DDP's backward. Every rank stops reporting at
about the same moment, so staleness alone named whichever rank came first (rank 0 in the issue's
run). Here one job runs several hang rounds — a different rank sleeps in each attempt, mlaunch
restarts after each — and every round must name the sleeper first, with its innermost frame, in
mlaunch's failure line, in events.jsonl and in ``mlaunch status``. Locally (one mlaunch, 2 × 2
simulated) and on two network-namespace hosts (one mlaunch per host: the sleeper's node must be
the job's first failure, not a node whose ranks only wait). Real torch.distributed (gloo, CPU).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, needs_torch, run_mlaunch
from netns import Host, hosts_fixture

from launchers.observe.events_log import read_events
from launchers.run.hang import innermost_frame
from launchers.run.hang_stacks import main_thread_dumped

SCRIPT = ROOT / "tests" / "scripts" / "hang_rounds.py"
SLEEP_LINE = next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "# SLEEPS HERE" in text)
FRAME = f"hang_rounds.py:{SLEEP_LINE} in <module>"
RANKS = 4

hosts2 = pytest.fixture(hosts_fixture(2), name="hosts2")


def stacks_of(argv: list[str], cwd: Path | None = None) -> str:
    """What a real process that registered ``faulthandler`` on SIGURG dumps when it gets the signal after its
    ``ready`` line (its stderr; the process is killed after)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        proc.send_signal(signal.SIGURG)
        time.sleep(0.5)
    finally:
        proc.kill()
    return proc.communicate(timeout=10)[1]


def test_the_innermost_frame_is_the_main_threads_from_a_real_faulthandler_dump() -> None:
    """A real dump (faulthandler on SIGURG, as ``launchers.elastic`` registers it) with a second thread."""
    code = textwrap.dedent(
        """
        import faulthandler, os, signal, sys, threading, time
        faulthandler.register(signal.SIGURG, all_threads=True)
        def helper():
            time.sleep(60)  # HELPER
        threading.Thread(target=helper, daemon=True).start()
        def stuck():
            print("ready", flush=True)
            time.sleep(60)  # MAIN
        stuck()
        """
    )
    dump = stacks_of([sys.executable, "-c", code])
    main_line = next(i for i, t in enumerate(code.splitlines(), 1) if "# MAIN" in t)
    assert "Thread 0x" in dump and "helper" in dump, dump  # both threads were dumped ...
    assert innermost_frame(dump) == f"<string>:{main_line} in stuck", dump  # ... the main thread's frame is named
    assert innermost_frame("no stacks here\n") is None


def test_a_dump_is_whole_once_the_main_threads_outermost_frame_is_in_it(tmp_path: Path) -> None:
    """mlaunch stops waiting for a rank's stacks as soon as its main thread's block is whole (no quiet period):
    a real dump of a module run with ``-m`` (the way a standby runs: runpy frames outermost, ``<frozen runpy>``
    since Python 3.11) is whole; the same dump cut inside the main thread's block, or mid-line, is not."""
    (tmp_path / "stuckmod.py").write_text(
        textwrap.dedent(
            """
            import faulthandler, signal, threading, time
            faulthandler.register(signal.SIGURG, all_threads=True)
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
            def stuck():
                print("ready", flush=True)
                time.sleep(60)
            stuck()
            """
        )
    )
    dump = stacks_of([sys.executable, "-m", "stuckmod"], cwd=tmp_path)
    lines = dump.splitlines(keepends=True)
    current = next(i for i, line in enumerate(lines) if line.startswith("Current thread"))
    assert main_thread_dumped(dump), dump
    assert not main_thread_dumped("".join(lines[: current + 2])), dump  # the main thread's innermost frame only
    assert not main_thread_dumped("".join(lines[:current])), dump  # the other thread's block only
    module_line = next(i for i, line in enumerate(lines) if i > current and "in <module>" in line)
    half = "".join(lines[:module_line]) + lines[module_line][:-4]
    assert not main_thread_dumped(half) and main_thread_dumped(half + "le>\n"), dump  # a line still being written


def hang_job(tmp: Path, rounds: int) -> Path:
    job = tmp / "job.yaml"
    job.write_text(
        f"name: hang-rounds\nengine: pytorch\nentry: {SCRIPT}\nnodes: 2\nprocs_per_node: 2\n"
        f"log_dir: {tmp / 'logs'}\nmonitor: {{hang_timeout: 2s}}\n"
        f"restart: {{max_restarts: {rounds - 1}, backoff: 0s}}\n"
    )
    return job


def assert_every_round_names_the_sleeper(events: list[dict], order: list[int], nodes: set[int | None]) -> None:
    """Each node's hang event of attempt ``a`` names ``order[a]`` first, then the three ranks that waited."""
    hangs = [e for e in events if e["event"] == "hang"]
    failures = [e for e in events if e["event"] == "failure"]
    assert not failures, failures
    for attempt, sleeper in enumerate(order):
        mine = [e for e in hangs if e["attempt"] == attempt]
        assert {e.get("node") for e in mine} == nodes, (attempt, mine)
        for event in mine:
            assert event["rank"] == sleeper, (attempt, sleeper, event)
            assert event["label"].endswith(f"rank {sleeper}"), event  # the rank the cause is about
            cause = event["cause"]
            assert cause.index("outside any collective wait") < cause.index("waiting in a collective"), cause
        declared = [e for e in mine if "outside_collective" in e]  # the node that declared it
        assert len(declared) == 1, mine
        assert declared[0]["outside_collective"] == [sleeper], declared
        assert sorted(declared[0]["in_collective"]) == sorted({*range(RANKS)} - {sleeper} & _node_ranks(declared[0]))
        assert declared[0]["frames"] == {str(sleeper): FRAME}, declared


def _node_ranks(event: dict) -> set[int]:
    """The ranks the declaring mlaunch watches: all four in a simulation, its node's two on a host."""
    return set(range(RANKS)) if event.get("node") is None else {2 * event["node"], 2 * event["node"] + 1}


@needs_torch
@pytest.mark.slow
def test_the_sleeping_rank_is_named_first_in_every_round_local(tmp_path: Path) -> None:
    order = [3, 0, 2, 1, 3]
    job = hang_job(tmp_path, len(order))
    result = run_mlaunch([str(job)], env=clean_env(HANG_ORDER=",".join(map(str, order)), GLOO_SOCKET_IFNAME="lo"))
    assert result.returncode == 137, result.stderr[-4000:]
    announced = re.findall(r"mlaunch: node \d rank (\d) \(pid \d+\) hung: ", result.stderr)
    assert [int(r) for r in announced] == order, result.stderr[-4000:]
    pattern = rf"rank (\d) is outside any collective wait; innermost frame: {re.escape(FRAME)}"
    framed = re.findall(pattern, result.stderr)
    assert [int(r) for r in framed] == order, result.stderr[-4000:]
    assert_every_round_names_the_sleeper(read_events(tmp_path / "logs" / "events.jsonl"), order, {None})

    # the last round ended the job: `mlaunch status` shows it, the sleeper first
    status = run_mlaunch(["status", "--json", str(job)])
    assert status.returncode == 0, status.stderr
    ranks = {r["rank"]: r for n in json.loads(status.stdout)["nodes"] for r in n["ranks"]}
    assert ranks[order[-1]]["hung"] and not ranks[order[-1]]["in_collective"], ranks
    assert ranks[order[-1]]["hang_frame"] == FRAME, ranks
    assert all(ranks[r]["hung"] and ranks[r]["in_collective"] for r in ranks if r != order[-1]), ranks
    shown = run_mlaunch(["status", str(job)], env=clean_env(COLUMNS="200"))
    assert shown.returncode == 0, shown.stderr
    line = next(text for text in shown.stdout.splitlines() if "collective" in text)
    assert line.startswith(f"hung outside any collective wait: rank {order[-1]} (node 1, at {FRAME})"), line
    assert "waiting in a collective: rank 0, rank 1, rank 2" in line, line


@needs_torch
@pytest.mark.slow
@pytest.mark.netns
def test_the_sleeping_rank_is_named_first_in_every_round_across_hosts(tmp_path: Path, hosts2: list[Host]) -> None:
    """One mlaunch per host; the node whose ranks only wait leaves the declaration to the sleeper's node."""
    order = [1, 2, 0, 3, 2]
    job = hang_job(tmp_path, len(order))
    procs = []
    for host in hosts2:
        env = clean_env(
            MA_NUM_GPUS="2",
            MA_NUM_HOSTS="2",
            VC_TASK_INDEX=str(host.index),
            VC_WORKER_HOSTS=",".join(h.name for h in hosts2),
            GLOO_SOCKET_IFNAME="eth0",
            HANG_ORDER=",".join(map(str, order)),
        )
        argv = [*mlaunch_cmd(), "--engine", "pytorch", str(job), "--init_method", f"tcp://{hosts2[0].name}:6666"]
        argv += ["--rank", str(host.index), "--world_size", "2"]
        procs.append(host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        results.append((proc.returncode, out, err))
    text = "\n".join(
        f"--- host {i} exit {rc}\n{out[-2000:]}\n{err[-6000:]}" for i, (rc, out, err) in enumerate(results)
    )
    assert [rc for rc, _, _ in results] == [137, 137], text
    for _, _, err in results:  # each mlaunch heard the sleeper's node first, every round
        firsts = re.findall(r"first failure in the job \(generation \d+\): node \d(?: \([^)]*\))? rank (\d)", err)
        assert [int(rank) for rank in firsts] == order, text
    assert_every_round_names_the_sleeper(read_events(tmp_path / "logs" / "events.jsonl"), order, {0, 1})
