"""The job's control-plane key in a manifest: a Secret with a random value, and every pod reading it.

Without a key of its own, mlaunch's control plane derives one from facts anyone who can read
the pod spec can assemble (``launchers.control.wire``). Every ``mlaunch manifest`` therefore
writes a Secret ``<job>-mlaunch-key`` holding a value made anew at each generation, and gives
every container of every pod ``MLAUNCH_JOB_SECRET`` from it (``valueFrom.secretKeyRef``).

The Secret is ``immutable``: a regenerated file applied over a running job would otherwise
give the pods restarted later another key than the ones still running (they would never be
heard); Kubernetes refuses the change instead, and ``kubectl delete -f FILE`` removes both.
This module is applied to whatever a target built (``with_job_key``), so targets know nothing of it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

from launchers.control.wire import SECRET_ENV
from launchers.generate.k8s.parts import Manifest
from launchers.generate.k8s.pod import labels

SUFFIX = "-mlaunch-key"
KEY_BYTES = 32  # 256 random bits, hex: what ``openssl rand -hex 32`` gives in the sbatch script


def secret_name(job_name: str) -> str:
    return f"{job_name}{SUFFIX}"


def secret_document(namespace: str, job_name: str, value: str) -> dict[str, Any]:
    """A v1 Secret holding the key under ``MLAUNCH_JOB_SECRET``; immutable (see the module's docstring)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name(job_name), "namespace": namespace, "labels": labels(job_name)},
        "type": "Opaque",
        "immutable": True,
        "stringData": {SECRET_ENV: value},
    }


def key_env(job_name: str) -> dict[str, Any]:
    """The container's ``MLAUNCH_JOB_SECRET``, read from the Secret by the kubelet."""
    return {"name": SECRET_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name(job_name), "key": SECRET_ENV}}}


def containers(document: Any) -> Iterator[dict[str, Any]]:
    """Every container of every pod spec in ``document`` (whatever the operator's nesting)."""
    if isinstance(document, dict):
        found = document.get("containers")
        if isinstance(found, list) and all(isinstance(c, dict) for c in found):
            yield from found
        for key, value in document.items():
            if key != "containers":
                yield from containers(value)
    elif isinstance(document, list):
        for item in document:
            yield from containers(item)


def with_job_key(manifest: Manifest, job_name: str, namespace: str, value: str | None = None) -> Manifest:
    """``manifest`` with the Secret last and ``MLAUNCH_JOB_SECRET`` in every container; ``value``: random if None."""
    for document in manifest.documents:
        for container in containers(document):
            container.setdefault("env", []).append(key_env(job_name))
    key = value if value is not None else secrets.token_hex(KEY_BYTES)
    manifest.documents.append(secret_document(namespace, job_name, key))
    manifest.notes.append(
        f"Secret {secret_name(job_name)} holds this job's control-plane key ({SECRET_ENV}), new at every "
        "`mlaunch manifest`: keep this file private; the Secret is immutable, so `kubectl delete -f` this file "
        "before applying a regenerated one"
    )
    return manifest
