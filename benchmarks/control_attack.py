"""Training while a stranger attacks node 0's control port (issue 47): steps/s during the attack over before it.

Root: it makes 3 network-namespace hosts on one bridge (``tests/netns.py``). Hosts 1 and 2 run a
real DDP job (gloo over the hosts' ``eth0``, 1 rank each, one mlaunch per host the ModelArts way,
a random ``MLAUNCH_JOB_SECRET``); host 3, without the secret, attacks node 0's control port with
``tests/scripts/stranger.py`` — 200 connections held silent, garbage, messages forged with the
key anyone can derive (over NULL and over CURVE), a 128 MiB frame, and a flood of new connections
sending random bytes for ``--attack`` seconds — and, beside it, a burst of ``--connections``
connections held open without a word (``--burst``). All on this machine's cores: the attacker's
CPU is taken from the job's, as on a shared node it would be.

The worker (``--worker``) is a small MLP stepped as fast as the CPU allows, each step stamped with
CLOCK_MONOTONIC (one clock in every namespace); rank 0's stamps give the steps per second in a
window before the attack and in the attack's window, **in the same run**: the ratio is the
figure (goal ≥ 0.70). Also reported, as outcomes: every mlaunch's exit code (goal 0), restarts
and membership changes (goal none), and what node 0's ``mlaunch status`` counted.

    sudo python benchmarks/control_attack.py                      # 10 s before, 10 s attack
    sudo python benchmarks/control_attack.py --before 15 --attack 15 --connections 2000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

STEP = re.compile(r"attack-bench step (\d+) ([0-9.]+)")
CONTROL_PORT = 7666  # the master port 6666 + the control plane's offset
STRANGER = ROOT / "tests" / "scripts" / "stranger.py"


class Until:
    """When the workers stop (monotonic): the driver writes it once it placed its windows (read twice a second)."""

    def __init__(self, path: Path) -> None:
        self.path, self.at, self.looked = path, float("inf"), 0.0

    def passed(self) -> bool:
        now = time.monotonic()
        if self.at == float("inf") and now - self.looked > 0.5:
            self.looked = now
            text = self.path.read_text().strip() if self.path.exists() else ""
            self.at = float(text) if text else self.at
        return now > self.at


# -- the worker (each rank) -------------------------------------------------------------------------
def worker(until: Until) -> None:
    """DDP steps until CLOCK_MONOTONIC passes ``until`` (all ranks stop at the same step), each one stamped."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    )
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 256, generator=torch.Generator().manual_seed(rank))
    step, stop = 0, torch.zeros(1)
    while not stop.item():
        optim.zero_grad()
        model(data).square().mean().backward()
        optim.step()
        step += 1
        if rank == 0:
            print(f"attack-bench step {step} {time.monotonic():.6f}", flush=True)
        stop[0] = float(until.passed())
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"attack-bench final {rank} {step} {checksum:.9e}", flush=True)
    dist.destroy_process_group()


# -- the stranger's burst of silent connections ------------------------------------------------------
def burst(host: str, port: int, count: int, seconds: float) -> None:
    """``count`` connections opened at once and held without a word for ``seconds``; says how many the other end
    closed before that (cut over the hub's cap, or at its handshake limit)."""
    conns = []
    for _ in range(count):
        conn = socket.socket()
        conn.setblocking(False)
        conn.connect_ex((host, port))
        conns.append(conn)
    time.sleep(seconds)
    closed = 0
    for conn in conns:
        try:
            while conn.recv(1 << 12):
                pass
            closed += 1
        except OSError:
            pass
        conn.close()
    print(f"stranger: burst_connections {count}\nstranger: burst_closed_by_hub {closed}", flush=True)


# -- the driver ----------------------------------------------------------------------------------------
class Lines:
    """Each mlaunch's output, read as it comes (rank 0's step stamps among it)."""

    def __init__(self) -> None:
        self.out: list[list[str]] = []
        self.threads: list[threading.Thread] = []

    def follow(self, proc: subprocess.Popen[str]) -> None:
        lines: list[str] = []
        self.out.append(lines)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        self.threads.append(thread)

    def steps(self) -> list[tuple[int, float]]:
        return [(int(m.group(1)), float(m.group(2))) for m in map(STEP.search, list(self.out[0])) if m]


def rate(steps: list[tuple[int, float]], begin: float, end: float) -> float:
    """Steps per second whose stamps fall in [begin, end)."""
    return sum(1 for _, t in steps if begin <= t < end) / (end - begin)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench_env import platform_free_env
    from netns import NetnsHosts, netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason:
        raise SystemExit(f"control_attack: needs network namespaces (root): {reason}")
    with NetnsHosts(3) as net:
        job_hosts, stranger = net.hosts[:2], net.hosts[2]
        work = Path(tempfile.mkdtemp(prefix="control-attack-"))
        job = work / "job.yaml"
        job.write_text(
            f"name: attack\nengine: pytorch\nentry: {Path(__file__).resolve()}\nargs: ['--worker']\nnodes: 2\n"
            f"procs_per_node: 1\nlog_dir: {work / 'logs'}\nrestart: {{max_restarts: 1, backoff: 0s}}\n"
            f"monitor: {{node_timeout: {args.node_timeout}s}}\n"
        )
        base = platform_free_env()
        base.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MLAUNCH_JOB_SECRET=secrets.token_hex(32))
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH", "")]))
        lines, procs = Lines(), []
        started = time.monotonic()
        budget = args.before + args.attack + args.settle + 120  # start-up included: the worker stops by itself
        until_file = work / "until"
        base["ATTACK_BENCH_UNTIL_FILE"] = str(until_file)
        for host in job_hosts:
            argv = [sys.executable, "-m", "launchers", "--engine", "pytorch", str(job)]
            argv += ["--init_method", f"tcp://{job_hosts[0].name}:6666", "--rank", str(host.index), "--world_size", "2"]
            env = dict(
                base, GLOO_SOCKET_IFNAME="eth0", MA_NUM_GPUS="1", MA_NUM_HOSTS="2", VC_TASK_INDEX=str(host.index)
            )
            env["VC_WORKER_HOSTS"] = ",".join(h.name for h in job_hosts)
            proc = host.popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            procs.append(proc)
            lines.follow(proc)
        while not lines.steps():  # the job is up and stepping
            if time.monotonic() - started > 120 or any(p.poll() is not None for p in procs):
                raise SystemExit("control_attack: the job never stepped:\n" + "".join(lines.out[0][-40:]))
            time.sleep(0.2)
        first = lines.steps()[0][1]
        before_begin = first + args.settle
        attack_at = before_begin + args.before
        (work / "until.tmp").write_text(f"{attack_at + args.attack + 1.0:.6f}")
        (work / "until.tmp").rename(until_file)  # the workers stop a second after the attack
        time.sleep(max(0.0, attack_at - time.monotonic()))
        env = dict(base, PYTHONPATH=str(ROOT))
        env.pop("MLAUNCH_JOB_SECRET")
        attackers = [
            stranger.popen([sys.executable, str(STRANGER), job_hosts[0].ip, str(CONTROL_PORT), "attack",
                            str(args.attack)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
            stranger.popen([sys.executable, str(Path(__file__).resolve()), "--burst", job_hosts[0].ip,
                            str(CONTROL_PORT), str(args.connections), str(args.attack)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        ]  # fmt: skip
        attack_out = "".join(a.communicate(timeout=args.attack + 120)[0] for a in attackers)
        codes = [p.wait(timeout=budget) for p in procs]
        for thread in lines.threads:
            thread.join(timeout=10)
        steps = lines.steps()
        before = rate(steps, before_begin, attack_at)
        during = rate(steps, attack_at, attack_at + args.attack)
        out = "".join(line for group in lines.out for line in group)
        status = json.loads((work / "logs" / "status.json").read_text())
        return {
            "before_steps_per_s": round(before, 2),
            "during_steps_per_s": round(during, 2),
            "ratio": round(during / before, 3) if before else None,
            "exit_codes": codes,
            "restarts": status.get("restarts"),
            "membership_changes": sum(out.count(w) for w in (" lost", "left out", "attempt 1")),
            "finals": re.findall(r"attack-bench final (\d+) (\d+) (\S+)", out),
            "control_plane": status.get("control_plane"),
            "stranger": dict(re.findall(r"stranger: (\w+) (\d+)", attack_out)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="(internal) a rank of the job")
    parser.add_argument("--burst", nargs=4, metavar=("HOST", "PORT", "COUNT", "SECONDS"), help="(internal)")
    parser.add_argument("--before", type=float, default=10.0, help="seconds measured before the attack")
    parser.add_argument("--attack", type=float, default=10.0, help="seconds the attack lasts (and is measured)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the first step before measuring")
    parser.add_argument("--connections", type=int, default=2000, help="the burst of silent connections")
    parser.add_argument("--node-timeout", type=float, default=3.0, help="a heartbeat this late loses a node")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.burst:
        host, port, count, seconds = args.burst
        burst(host, int(port), int(count), float(seconds))
        return
    if args.worker:
        worker(Until(Path(os.environ["ATTACK_BENCH_UNTIL_FILE"])))
        return
    figures = run(args)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"steps/s before the attack  {figures['before_steps_per_s']}")
    print(f"steps/s during the attack  {figures['during_steps_per_s']}")
    print(f"ratio                      {figures['ratio']}  (goal >= 0.70)")
    print(f"exit codes                 {figures['exit_codes']}  restarts {figures['restarts']}  "
          f"membership changes {figures['membership_changes']}")  # fmt: skip
    print(f"final parameters           {figures['finals']}")
    print(f"node 0 counted             {figures['control_plane']}")
    print(f"the stranger did           {figures['stranger']}")


if __name__ == "__main__":
    main()
