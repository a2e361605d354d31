"""Each test's CPU seconds, its processes' included: where CI's time goes on a machine whose cores are busy.

Opt-in: ``MLAUNCH_TEST_CPU_LOG=/path/prefix pytest ...`` (CI does not set it). On 2 cores the suite keeps both
busy (6-16 % idle), so a test's wall time says how long it waited for the other worker as much as what it
costs; its CPU does not. Each pytest process (the controller, every xdist worker) moves itself into a cgroup
of its own (v1 ``cpuacct``, as this VM has; without one nothing is logged), which every process it starts
inherits (``ip netns exec`` too; an ``sshd`` session does not), and writes ``<cpu s> <wall s> <node id>`` per
test phase to ``<prefix>.<worker>``. ``python tests/cpu_log.py /path/prefix`` sums them per file.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuLog:
    def __init__(self, prefix: str, worker: str) -> None:
        self.group = CPUACCT / f"mlaunch-tests-{worker}-{os.getpid()}"
        self.group.mkdir()
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        self.out = open(f"{prefix}.{worker}", "a", buffering=1)  # noqa: SIM115 - open for the session

    def usage(self) -> float:
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cpu, wall = self.usage(), time.monotonic()
        yield
        self.out.write(f"{self.usage() - cpu:.2f} {time.monotonic() - wall:.2f} {item.nodeid}\n")

    def pytest_unconfigure(self) -> None:
        """Back to the parent group; this one goes once its last process has (a leftover one keeps it)."""
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        self.out.close()
        with contextlib.suppress(OSError):
            self.group.rmdir()


def register(config: pytest.Config) -> None:
    prefix = os.environ.get("MLAUNCH_TEST_CPU_LOG")
    if not prefix or not (CPUACCT / "cgroup.procs").exists():
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "controller")
    config.pluginmanager.register(CpuLog(prefix, worker), "mlaunch-cpu-log")


def summary(prefix: str) -> None:
    cpu: defaultdict[str, float] = defaultdict(float)
    wall: defaultdict[str, float] = defaultdict(float)
    tests: defaultdict[str, int] = defaultdict(int)
    each: list[tuple[float, float, str]] = []
    for log in Path(prefix).parent.glob(Path(prefix).name + ".*"):
        for line in log.read_text().splitlines():
            used, took, nodeid = line.split(" ", 2)
            name = nodeid.split("::")[0]
            cpu[name] += float(used)
            wall[name] += float(took)
            tests[name] += 1
            each.append((float(used), float(took), nodeid))
    print(f"{sum(cpu.values()):.0f} CPU s, {sum(wall.values()):.0f} wall s over {sum(tests.values())} tests")
    for name in sorted(cpu, key=cpu.__getitem__, reverse=True)[:40]:
        print(f"{cpu[name]:8.1f} cpu {wall[name]:8.1f} wall {tests[name]:4d}  {name}")
    print("the tests that took most CPU:")
    for spent, lasted, test in sorted(each, reverse=True)[:40]:
        print(f"{spent:8.1f} cpu {lasted:8.1f} wall  {test}")


if __name__ == "__main__":
    summary(sys.argv[1])
