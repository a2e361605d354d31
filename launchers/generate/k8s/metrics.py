"""``metrics: {port: P}`` on the pods: the port exposed and the ``prometheus.io/*`` scrape annotations.

Every pod of a job gets them (a Volcano task's pods share one template): node 0's mlaunch serves the
job's figures there, every other node's mlaunch only ``mlaunch_node_info``, so each scraped pod is up
(``launchers.observe.metrics``). Nothing when ``metrics.port`` is unset.
"""

from __future__ import annotations

from typing import Any

from launchers.config.job import Job
from launchers.errors import UserError

PORT_NAME = "metrics"


def metrics_exposure(job: Job, ports: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(the container's ports with the metrics port added, pod annotations); unchanged and none when it is unset."""
    port = job.metrics.port
    if port is None:
        return ports, {}
    taken = next((p for p in ports if p.get("containerPort") == port), None)
    if taken is not None:
        where = f"{job.source}: " if job.source else ""
        raise UserError(
            f"{where}metrics.port {port} is also the pod's {taken.get('name', 'other')} port; choose another port"
        )
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}
    return [*ports, {"containerPort": port, "name": PORT_NAME}], annotations
