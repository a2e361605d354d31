"""Messages of the control plane: JSON payloads, each after an HMAC-SHA256 of it under the per-job secret, in one frame.

The secret is ``MLAUNCH_JOB_SECRET`` when set (the same value on every node), else derived
from what every node of the job shares and nothing outside it is told: the job's name,
the master address, the control port, the platform's job id where one is set, and a
secret file every node holds where the engine has one (MPI: the job's ssh key). A
message whose MAC does not match is dropped (and counted), never acted on. Keyed from public
facts alone (no secret, no key file), node 0 says so (``PUBLIC_KEY_WARNING``). Encryption,
freshness and who may connect at all are the sockets' (``transport``: CURVE, keyed from this key).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

SECRET_ENV = "MLAUNCH_JOB_SECRET"
MAC_SIZE = 32  # HMAC-SHA256
JOB_ID_ENV = ("MLAUNCH_JOB_ID", "MA_JOB_ID", "VC_JOB_ID", "SLURM_JOB_ID", "JOB_ID")  # the same on every node


PUBLIC_KEY_WARNING = (
    "control plane: no MLAUNCH_JOB_SECRET is set, so its key is derived from public facts (the job's name, "
    "master address, port and job id): anyone who can read the pod spec or the process list can forge its "
    "messages. Set MLAUNCH_JOB_SECRET to the same random value on every node (`mlaunch manifest` and "
    "`mlaunch sbatch` do it for you: `openssl rand -hex 32`)"
)


def keyed_from_public_facts(env: Mapping[str, str], key_file: str = "") -> bool:
    """Whether ``job_secret`` falls back to facts anyone who sees the job can assemble (node 0 says so, once)."""
    import os

    return not (os.environ.get(SECRET_ENV) or env.get(SECRET_ENV) or key_file)


def job_secret(job_name: str, master_addr: str, port: int, env: Mapping[str, str], key_file: str = "") -> bytes:
    """The per-job key: the given secret, else one derived from the facts every node shares.

    ``key_file`` is a secret file every node of the job holds (the MPI engine's job ssh key):
    its bytes go into the derived key, so knowing the job's name and addresses is not enough.
    """
    import os

    given = os.environ.get(SECRET_ENV) or env.get(SECRET_ENV)
    if given:
        return hashlib.sha256(b"mlaunch-control-given\0" + given.encode()).digest()
    job_id = next((env[name] for name in JOB_ID_ENV if env.get(name)), "")
    facts = "\0".join(["mlaunch-control", job_name, master_addr, str(port), job_id])
    digest = hashlib.sha256(facts.encode())
    if key_file:
        with open(key_file, "rb") as key:
            digest.update(b"\0key\0" + hashlib.sha256(key.read()).digest())
    return digest.digest()


def seal(secret: bytes, message: Mapping[str, Any]) -> list[bytes]:
    """The frames to send: one, the payload's MAC (32 bytes) then the payload. Encoded once, it can go to many."""
    payload = json.dumps(message, separators=(",", ":"), sort_keys=True).encode()
    return [hmac.digest(secret, payload, "sha256") + payload]


def unseal(secret: bytes, frames: list[bytes]) -> dict[str, Any] | None:
    """The message's JSON object, or None when the frames are malformed or their MAC is wrong (``messages.decode``)."""
    if len(frames) != 1 or len(frames[0]) < MAC_SIZE:
        return None
    mac, payload = frames[0][:MAC_SIZE], frames[0][MAC_SIZE:]
    if not hmac.compare_digest(hmac.digest(secret, payload, "sha256"), mac):
        return None
    try:
        message = json.loads(payload)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
