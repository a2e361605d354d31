"""The job secret: one client key pair and one job-wide host key pair.

``mlaunch keys DIR`` writes it once; the platform mounts it on every node (a Kubernetes
Secret, a mounted directory) or job.yaml names it (``mpi.keys_dir``). Every node's sshd
uses the same host key, so a single pinned ``known_hosts`` line (under the alias
``mlaunch-job``) lets ssh check host keys strictly without any per-host key exchange.

Files in the secret directory (all private ones 0600, the directory 0700):

- ``id_ed25519`` / ``id_ed25519.pub`` — the client key mpirun's ssh and the readiness check use;
- ``authorized_keys`` — that public key, for every node's sshd;
- ``ssh_host_ed25519_key`` / ``ssh_host_ed25519_key.pub`` — the job-wide host key;
- ``known_hosts`` — ``mlaunch-job <host public key>``, for ``ssh -o HostKeyAlias=mlaunch-job``.

The job's control plane (``launchers.control``) mixes the client private key into its
message key for MPI jobs, so no extra secret has to be distributed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from bootstrap.runtime import AUTHORIZED_KEYS, CLIENT_KEY, HOST_KEY, HOST_KEY_ALIAS, KNOWN_HOSTS, NodeFiles
from launchers.atomic import write_atomic

REQUIRED = (CLIENT_KEY, HOST_KEY, HOST_KEY + ".pub", AUTHORIZED_KEYS)


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with a fresh 0600 file holding ``data``.

    ``launchers.atomic.write_atomic``: the data goes to a new 0600 temporary file that then
    replaces ``path`` — never written through a symlink, never briefly readable by others,
    never seen half-written.
    """
    write_atomic(path, data, 0o600)


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) and make it 0700 — sshd's StrictModes rejects a writable one."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid == os.geteuid():
        os.chmod(path, 0o700)


def _generate_pair() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public


def known_hosts_line(host_public: str) -> str:
    """The single pinned entry: ``mlaunch-job ssh-ed25519 AAAA...``."""
    fields = host_public.split()
    if len(fields) < 2:
        raise ValueError("not an OpenSSH public key line")
    return f"{HOST_KEY_ALIAS} {fields[0]} {fields[1]}\n"


def generate(directory: Path, *, comment: str = "mlaunch-job", force: bool = False) -> list[Path]:
    """Create the job secret in ``directory``; refuse to overwrite an existing one unless ``force``."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    existing = [directory / name for name in (*REQUIRED, KNOWN_HOSTS) if (directory / name).exists()]
    if existing and not force:
        raise FileExistsError(", ".join(str(p) for p in existing))
    client_private, client_public = _generate_pair()
    host_private, host_public = _generate_pair()
    client_line = client_public.decode() + f" {comment}\n"
    host_line = host_public.decode() + f" {comment}-host\n"
    written = []
    for name, data in (
        (CLIENT_KEY, client_private),
        (CLIENT_KEY + ".pub", client_line.encode()),
        (AUTHORIZED_KEYS, client_line.encode()),
        (HOST_KEY, host_private),
        (HOST_KEY + ".pub", host_line.encode()),
        (KNOWN_HOSTS, known_hosts_line(host_line).encode()),
    ):
        path = directory / name
        write_private(path, data)  # a fresh file replaces whatever was there, a symlink included
        written.append(path)
    return written


def problems(directory: Path) -> list[str]:
    """What is wrong with a job secret directory (empty list: usable)."""
    if not directory.is_dir():
        return [f"{directory} is not a directory"]
    found = []
    missing = [name for name in REQUIRED if not (directory / name).is_file()]
    if missing:
        found.append(f"{directory} lacks {', '.join(missing)}")
    for name in (CLIENT_KEY, HOST_KEY):
        path = directory / name
        if path.is_file():
            try:
                head = path.read_bytes()[:64]
            except OSError as exc:
                found.append(f"cannot read {path}: {exc.strerror}")
                continue
            if b"PRIVATE KEY" not in head:
                found.append(f"{path} is not a private key in OpenSSH/PEM form")
    return found


def loose_permissions(directory: Path) -> list[Path]:
    """Private files others may read (fine for a mounted secret we copy; worth a warning in a checkout)."""
    loose = []
    for name in (CLIENT_KEY, HOST_KEY):
        path = directory / name
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            loose.append(path)
    return loose


@dataclass(frozen=True)
class Installed:
    files: NodeFiles
    host_public: str


def install(source: Path, files: NodeFiles) -> Installed:
    """Copy the secret into the node's private runtime directory (0700, files 0600)."""
    make_private_dir(files.dir.parent)
    make_private_dir(files.dir)
    for name in (CLIENT_KEY, HOST_KEY, AUTHORIZED_KEYS):
        write_private(files.dir / name, (source / name).read_bytes())
    host_public = (source / (HOST_KEY + ".pub")).read_text().strip()
    write_private(files.known_hosts, known_hosts_line(host_public).encode())
    return Installed(files, host_public)


def remove_secrets(files: NodeFiles) -> None:
    """Delete the copies of private material once the node's attempt is over."""
    for path in files.secret_files:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
