"""Messages of the control plane: JSON payloads, each after a freshness header and an HMAC-SHA256 of both, in one frame.

The secret is ``MLAUNCH_JOB_SECRET`` when set (the same value on every node), else derived
from what every node of the job shares and nothing outside it is told: the job's name,
the master address, the control port, the platform's job id where one is set, and a
secret file every node holds where the engine has one (MPI: the job's ssh key). A
message whose MAC does not match is dropped (and counted), never acted on. Keyed from public
facts alone (no secret, no key file), node 0 says so (``PUBLIC_KEY_WARNING``). Encryption
and who may connect at all are the sockets' (``transport``: CURVE, keyed from this key).

Freshness is this module's too, so that it holds without CURVE (a libzmq without libsodium) and
across connections: every sender (the hub, each agent's run of a node) draws a random 8-byte
``stream`` when it starts and numbers what it seals 1, 2, 3 … (``Outgoing``); both go under the
MAC. A receiver keeps the last number it acted on from each stream (``Incoming``) and drops a
message that is not newer: a replayed message, on the same connection or a new one, and one
re-ordered behind a newer, are dropped and counted (``mlaunch status``: "replayed"). What one
receiver never heard of is new to it: a stream sealed by an earlier run of the job under the
same key (a reused ``MLAUNCH_JOB_SECRET``) is not known to a fresh hub (``docs/control-plane.md``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from collections.abc import Mapping
from typing import Any

SECRET_ENV = "MLAUNCH_JOB_SECRET"
MAC_SIZE = 32  # HMAC-SHA256
HEADER = struct.Struct(">8sQ")  # the sender's stream, the message's number in it: under the MAC
SEALED = MAC_SIZE + HEADER.size  # where the JSON payload begins
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


class Outgoing:
    """A sender's stream: a random id drawn once, and the number of the last message sealed in it."""

    def __init__(self) -> None:
        self.stream = os.urandom(8)
        self.seq = 0

    def next(self) -> bytes:
        self.seq += 1
        return HEADER.pack(self.stream, self.seq)


class Incoming:
    """What a receiver acted on from each sender's stream: the last number; anything not newer is stale.

    Only messages whose MAC verified reach it, so only holders of the key add streams (one per
    run of a node, and one per hub): its size is the job's, not a stranger's.
    """

    def __init__(self) -> None:
        self.last: dict[bytes, int] = {}
        self.replayed = 0  # messages dropped: a number already acted on, or older than one (re-ordered)

    def fresh(self, frames: list[bytes]) -> bool:
        """Whether a verified message (``unseal`` said so) is newer than all its stream said before; it is, now."""
        stream, seq = HEADER.unpack_from(frames[0], MAC_SIZE)
        if seq <= self.last.get(stream, 0):
            self.replayed += 1
            return False
        self.last[stream] = seq
        return True


def encode(message: Mapping[str, Any]) -> bytes:
    """The JSON payload ``seal`` signs (kept by a sender that seals the same message again later)."""
    return json.dumps(message, separators=(",", ":"), sort_keys=True).encode()


def seal(secret: bytes, message: Mapping[str, Any] | bytes, out: Outgoing | None = None) -> list[bytes]:
    """The frames to send: one, the MAC (32 bytes), the header (stream, number), then the payload.

    ``out``: the sender's stream (a one-message stream of its own without one: a tool's, a test's).
    Sealed once, the same frames may go to many receivers (a broadcast), each hearing it once;
    ``message`` may be a payload ``encode`` made, to seal again with a new number."""
    payload = message if isinstance(message, bytes) else encode(message)
    signed = (out or Outgoing()).next() + payload
    return [hmac.digest(secret, signed, "sha256") + signed]


def unseal(secret: bytes, frames: list[bytes]) -> dict[str, Any] | None:
    """The message's JSON object, or None when the frames are malformed or their MAC is wrong (``messages.decode``).

    Whether it is fresh is the receiver's ``Incoming.fresh`` (after this, on the same frames)."""
    if len(frames) != 1 or len(frames[0]) < SEALED:
        return None
    mac, signed = frames[0][:MAC_SIZE], frames[0][MAC_SIZE:]
    if not hmac.compare_digest(hmac.digest(secret, signed, "sha256"), mac):
        return None
    try:
        message = json.loads(signed[HEADER.size :])
    except ValueError:
        return None
    return message if isinstance(message, dict) else None
