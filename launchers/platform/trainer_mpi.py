"""Kubeflow Trainer v2 MPI runtimes: the hostfile Trainer mounts on the launcher pod.

Trainer v2.3.0's mpi plugin (``pkg/runtime/framework/plugins/mpi/mpi.go``) writes the ConfigMap
``<trainjob>-mpi-hostfile`` — one ``<pod host>.<trainjob> slots=<numProcPerNode>`` line per node
pod, in the order of the runtime's replicated Jobs (the launcher too with ``runLauncherAsNode``) —
mounts it at ``/etc/mpi/hostfile`` on the launcher and points ``OMPI_MCA_orte_default_hostfile``
there. Its pods are Indexed-Job pods (``JOB_COMPLETION_INDEX``), which is how this hostfile is
told apart from an MPIJob's (the MPI Operator mounts one at the same path).

What it gives mlaunch on that pod: every node's host (the first is the master), processes per
node (``slots``), and this node's index — the line whose first DNS label is this pod's
``HOSTNAME``. The path comes from ``OMPI_MCA_orte_default_hostfile``, so a test can point it at
a file of its own.

Not used: the ssh Secret ``<trainjob>-mpi-ssh-auth`` Trainer mounts at ``sshAuthMountPath``. It
holds a client key and ``authorized_keys`` only, while mlaunch's sshd pins one job-wide host key
(``mlaunch keys``) so that ssh checks host keys strictly; MPI jobs keep using that secret.
"""

from __future__ import annotations

import re
import socket
import stat
from collections.abc import Mapping
from pathlib import Path

from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE
from launchers.errors import PlatformError
from launchers.platform.numbers import parse_int
from launchers.platform.sighting import Sighting

SOURCE = "kubeflow-trainer-mpi"
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"
MAX_HOSTFILE_BYTES = 16 * 1024 * 1024
_LINE = re.compile(r"(?P<host>[A-Za-z0-9][-A-Za-z0-9.]*)(\s+slots=(?P<slots>\S+))?")


def _read_bounded(path: Path) -> str:
    """A regular file's text, at most ``MAX_HOSTFILE_BYTES`` (a FIFO or /dev/zero must not hang the plan)."""
    what = f"platform env {HOSTFILE_ENV}={str(path)[:200]!r} names a hostfile that cannot be read"
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise PlatformError(f"{what}: not a regular file")
        with path.open("rb") as fh:
            data = fh.read(MAX_HOSTFILE_BYTES + 1)
        if len(data) > MAX_HOSTFILE_BYTES:
            raise PlatformError(f"{what}: larger than {MAX_HOSTFILE_BYTES:,} bytes")
        return data.decode("utf-8")
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path, or bytes that are not UTF-8
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise PlatformError(f"{what}: {reason}") from None


def read_hostfile(path: Path) -> tuple[list[str], int | None]:
    """Hosts in file order and their common ``slots`` (None when no line gives one); bad lines are errors."""
    text = _read_bounded(path)
    hosts: list[str] = []
    slots: set[int] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise PlatformError(f"MPI hostfile {path} line {number} {raw!r}: expected '<host> slots=<n>'")
        hosts.append(match["host"])
        if match["slots"] is not None:
            what = f"MPI hostfile {path} line {number} slots"
            slots.add(parse_int(match["slots"], what, minimum=1, maximum=MAX_PROCS_PER_NODE))
    if not hosts or len(hosts) > MAX_NODES or len(set(hosts)) != len(hosts):
        raise PlatformError(f"MPI hostfile {path} must list 1..{MAX_NODES} distinct hosts; it lists {len(hosts)}")
    if len(slots) > 1:
        raise PlatformError(
            f"MPI hostfile {path} gives different slots per host ({sorted(slots)}); mlaunch runs the same"
        )
    return hosts, (slots.pop() if slots else None)


def from_trainer_hostfile(env: Mapping[str, str]) -> Sighting | None:
    """The launcher pod of a Trainer MPI runtime (its hostfile beside ``JOB_COMPLETION_INDEX``), or None."""
    named = env.get(HOSTFILE_ENV, "").strip()
    if not named or "JOB_COMPLETION_INDEX" not in env:
        return None
    path = Path(named)
    hosts, slots = read_hostfile(path)
    s = Sighting(SOURCE)
    s.put("hosts", hosts, f"{HOSTFILE_ENV}={named}")
    s.put("nnodes", len(hosts), f"{named} ({len(hosts)} hosts)")
    s.put("master_addr", hosts[0], f"first host of {named} {hosts[0]}")
    if slots is not None:
        s.put("nproc", slots, f"{named} slots={slots}")
    me = env.get("HOSTNAME", "").strip() or socket.gethostname()  # Kubernetes sets HOSTNAME to the pod's
    own = [i for i, host in enumerate(hosts) if me and host.split(".", 1)[0] == me]
    if own:
        s.put("node_rank", own[0], f"HOSTNAME={me} (line {own[0] + 1} of {named})")
    return s
