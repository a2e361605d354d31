"""Which hosts the job runs on, their addresses, and the Open MPI hostfile.

Sources, in order (the first that names the hosts wins): ``VC_WORKER_HOSTS``, the ModelArts
naming ``<MA_VJ_NAME>-<MA_TASK_NAME>-<i>.<MA_VJ_NAME>`` (both read by
``launchers.platform.cluster``), the Volcano svc plugin's ``/etc/volcano/<task>.host`` file, then
job.yaml's ``mpi.hosts``.

Names are resolved concurrently under one deadline, each by its own readiness check
(``bootstrap.readiness``; the seed's script resolved them one by one with ``ping`` in a
``sleep 1`` loop): a peer's DNS record appears only once its pod runs, so each name is
retried until it resolves or the deadline passes.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

VOLCANO_DIR = Path("/etc/volcano")


def volcano_hosts(task: str, directory: Path = VOLCANO_DIR) -> list[str]:
    """Hosts of ``task`` from the Volcano svc plugin's ConfigMap (``<task>.host``, one per line)."""
    path = directory / f"{task.replace('-', '_')}.host"
    if not path.is_file():
        path = directory / f"{task}.host"
    try:
        text = path.read_text()
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def resolve(host: str) -> str:
    """First IPv4 address of ``host`` (IPv6 if it has none); raises OSError when it does not resolve."""
    infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def render_hostfile(job: str, hosts: Sequence[str], slots: int) -> str:
    """Open MPI hostfile text: ``host slots=N`` per node, in node order."""
    from launchers.templating import render

    return render("hostfile.j2", job=job, hosts=list(hosts), slots=slots)


def env_with_hosts(env: Mapping[str, str], hosts: Sequence[str]) -> dict[str, str]:
    """``env`` plus ``VC_WORKER_HOSTS`` naming ``hosts`` (how a fallback source reaches platform detection)."""
    out = dict(env)
    out["VC_WORKER_HOSTS"] = ",".join(hosts)
    return out
