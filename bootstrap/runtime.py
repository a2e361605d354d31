"""Where a node keeps the job's ssh material at run time, and the ssh options that use it.

Why a directory of our own: a job secret mounted by the platform is typically read-only,
owned by someone else and mode 0644 — sshd refuses such a host key and ssh such an
identity. The engine's ``prepare`` copies the secret into a private directory (0700, files
0600) before anything starts. The path is a pure function of the job, the node and the env
(``mlaunch plan`` shows it and the node's processes are given it), so planning stays pure.

The root is chosen so sshd's ``StrictModes yes`` holds (no group/world-writable parent):
``$MLAUNCH_RUNTIME_DIR``, else ``/run/mlaunch`` for root, else ``$XDG_RUNTIME_DIR/mlaunch``,
else ``~/.cache/mlaunch/run``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launchers.errors import UserError

# The job-wide host key is pinned under this alias (ssh -o HostKeyAlias): one known_hosts
# line covers every node, whatever name or address mpirun uses to reach it.
HOST_KEY_ALIAS = "mlaunch-job"

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def runtime_root(env: Mapping[str, str]) -> Path:
    """The directory under which each job/node gets its private runtime directory."""
    explicit = env.get("MLAUNCH_RUNTIME_DIR", "").strip()
    if explicit:
        return Path(explicit)
    if os.geteuid() == 0:
        return Path("/run/mlaunch")
    xdg = env.get("XDG_RUNTIME_DIR", "").strip()
    if xdg:
        return Path(xdg) / "mlaunch"
    return Path.home() / ".cache" / "mlaunch" / "run"


CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
AUTHORIZED_KEYS = "authorized_keys"
KNOWN_HOSTS = "known_hosts"


class _File:
    """A file of the node's runtime directory, by name: ``NodeFiles(d).client_key`` is ``d/id_ed25519``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, files: NodeFiles, owner: type | None = None) -> Path:
        return files.dir / self.name


@dataclass(frozen=True)
class NodeFiles:
    """One node's private runtime directory and every file its bootstrap reads or writes there."""

    dir: Path
    client_key = _File(CLIENT_KEY)
    host_key = _File(HOST_KEY)
    authorized_keys = _File(AUTHORIZED_KEYS)
    known_hosts = _File(KNOWN_HOSTS)
    sshd_config = _File("sshd_config")
    sshd_pid = _File("sshd.pid")
    sshd_log = _File("sshd.log")
    hostfile = _File("hostfile")

    @property
    def secret_files(self) -> tuple[Path, ...]:
        """Copies of the job secret: removed when the node's attempt ends."""
        return (self.client_key, self.host_key, self.authorized_keys)


def node_files_for(job_name: str, job_source: str, node: int, env: Mapping[str, str]) -> NodeFiles:
    """The runtime directory of ``node`` for this job: ``<root>/<job>-<digest>-node<k>``.

    The digest of the job file's path keeps two jobs of the same name apart on one machine;
    the node index keeps simulated or namespace hosts sharing a filesystem apart.
    """
    root = runtime_root(env)
    digest = hashlib.sha256(job_source.encode()).hexdigest()[:8]
    name = f"{_SAFE.sub('-', job_name)[:48] or 'job'}-{digest}-node{node}"
    path = root / name
    if re.search(r"[\s\"'\\]", str(path)):
        # Open MPI splits plm_rsh_args on blanks, so a path with one would break ssh.
        raise UserError(
            f"the runtime directory {str(path)!r} contains a blank or a quote; set MLAUNCH_RUNTIME_DIR to a "
            "plain path such as /run/mlaunch"
        )
    return NodeFiles(path)


def ssh_client_args(files: NodeFiles, port: int, *, connect_timeout: int = 10) -> list[str]:
    """ssh options for mpirun's launcher: job key only, the pinned host key, never a prompt.

    ``StrictHostKeyChecking yes`` with a known_hosts file of our own: a host presenting any
    other key is refused, and nothing is ever written to ~/.ssh/known_hosts.
    """
    return [
        "-p",
        str(port),
        "-i",
        str(files.client_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={files.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        f"HostKeyAlias={HOST_KEY_ALIAS}",
        "-o",
        "CheckHostIP=no",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        "BatchMode=yes",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "LogLevel=ERROR",
    ]
