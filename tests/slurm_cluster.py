"""A real Slurm cluster made of network-namespace hosts, for tests: slurmctld + one slurmd per host.

Debian's ``slurmctld slurmd slurm-client munge`` (22.05), nothing simulated:

- one ``munged`` in the root namespace with a key generated in the test's directory; its socket
  is a path on the shared filesystem, so every namespace reaches it (``AuthInfo=socket=...``);
- ``slurm.conf`` in the test's directory (``SLURM_CONF`` for daemons and clients alike):
  ``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, no accounting, whole nodes
  (``select/linear``); ``NodeAddr`` = each host's namespace IP, spool dir, pid and log files per
  node name (``%n``);
- slurmctld (on host 0) and each host's slurmd (``-N <its NodeName>``) run in the foreground
  inside their hosts (own netns, UTS hostname and /etc/hosts), so the test owns their processes.

Gotcha measured here: ``ip netns exec`` remounts /sys, so /sys/fs/cgroup is empty inside a
host and slurmd's cgroup autodetection fails ("No filesystem mounted on /sys/fs/cgroup",
"Unable to initialize cgroup plugin"); ``CgroupPlugin=cgroup/v1`` with ``CgroupAutomount=yes``
in cgroup.conf lets slurmd start (nothing cgroup-based is used with the plugins above).

``AuthInfo=...,cred_expire=10``: a requeued job may start again only when its old credential has
expired (default 120 s: it waited ``Reason=BeginTime`` for 121 s, and forcing ``StartTime=now``
made slurmd refuse it, "Job credential revoked"); 10 s keeps the requeue test short.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from netns import Host, NetnsHosts

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "scancel", "sinfo")


def slurm_unavailable_reason() -> str | None:
    missing = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if missing:
        packages = "slurmctld slurmd slurm-client munge"
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install {packages}"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def node_names(prefix: str, count: int) -> list[tuple[str, str]]:
    """Slurm-style names: ``node01``, ``node02`` → the node list ``node[01-02]`` (each netns has its own names)."""
    del prefix
    return [(f"node{i + 1:02d}", f"node{i + 1:02d}") for i in range(count)]


class SlurmCluster:
    """``count`` namespace hosts running slurmd, host 0 also slurmctld; ``close()`` stops everything."""

    def __init__(self, count: int, workdir: Path) -> None:
        self.workdir = workdir
        self.net = NetnsHosts(count, names=node_names)
        self.daemons: list[subprocess.Popen[str]] = []
        self.munged_pid: int | None = None
        self.conf = workdir / "slurm.conf"

    @property
    def hosts(self) -> list[Host]:
        return self.net.hosts

    def env(self, **extra: str) -> dict[str, str]:
        from conftest import clean_env

        return clean_env(SLURM_CONF=str(self.conf), **extra)

    def start(self) -> None:
        self.net.create()
        self._munge()
        self._config()
        ctl = self.hosts[0]
        log = (self.workdir / "slurmctld.out").open("w")
        self.daemons.append(
            ctl.popen([_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=self.env(), stdout=log, stderr=log)
        )
        for host in self.hosts:
            log = (self.workdir / f"slurmd-{host.name}.out").open("w")
            argv = [_exe("slurmd"), "-D", "-f", str(self.conf), "-N", host.name]
            self.daemons.append(host.popen(argv, env=self.env(), stdout=log, stderr=log))
        self.wait_idle()

    def _munge(self) -> None:
        key = self.workdir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        d = self.workdir
        argv = [_exe("munged"), "--force", f"--key-file={key}", f"--socket={d / 'munge.sock'}"]
        argv += [f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"]
        subprocess.run(argv, check=True, timeout=30, capture_output=True)
        self.munged_pid = int((d / "munged.pid").read_text().split()[0])

    def _config(self) -> None:
        d, ctl = self.workdir, self.hosts[0]
        for host in self.hosts:
            (d / f"spool-{host.name}").mkdir()
        (d / "state").mkdir()
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n")
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.ip} CPUs={os.cpu_count() or 2} State=UNKNOWN\n" for h in self.hosts
        )
        self.conf.write_text(
            f"ClusterName=mlaunchtest\nSlurmctldHost={ctl.name}({ctl.ip})\nSlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d / 'munge.sock'},cred_expire=10\n"
            f"StateSaveLocation={d / 'state'}\nSlurmdSpoolDir={d}/spool-%n\n"
            f"SlurmctldPidFile={d / 'slurmctld.pid'}\nSlurmdPidFile={d}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={d / 'slurmctld.log'}\nSlurmdLogFile={d}/slurmd-%n.log\n"
            "SlurmctldPort=6817\nSlurmdPort=6818\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nSelectType=select/linear\nSchedulerType=sched/builtin\n"
            "ReturnToService=2\nKillWait=30\nMpiDefault=none\nSwitchType=switch/none\nMinJobAge=3600\n"
            f"{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A Slurm client command on host 0 (the submit host)."""
        return self.hosts[0].run(list(argv), env=self.env(), timeout=timeout)

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            out = self.run("sinfo", "--noheader", "--format=%T %D").stdout.strip()
            if out == f"idle {len(self.hosts)}":
                return
            time.sleep(0.5)
        raise AssertionError(f"Slurm nodes did not become idle in {timeout}s: sinfo says {out!r}\n{self.logs()}")

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as KEY → value (the fields a test reads)."""
        out = self.run("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def wait_job(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {states} after {timeout}s: {info}\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.workdir.glob("slurm*.log")):
            lines = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def close(self) -> None:
        for proc in self.daemons:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.daemons:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.net.close()  # whatever the jobs left in the namespaces
        if self.munged_pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.munged_pid, signal.SIGTERM)
