"""``metrics:`` — Prometheus metrics of the running job, served by node 0's mlaunch (off by default).

Why a port of its own: a cluster watches its jobs by scraping them; node 0 holds the whole job's
view (every rank's step, the restarts, the goodput), so its mlaunch serves it at
``http://<node 0>:<port>/metrics`` (``launchers.observe.metrics``). ``mlaunch manifest`` exposes
the port on the pods and adds the ``prometheus.io/*`` scrape annotations when it is set.
"""

from __future__ import annotations

from pydantic import Field

from launchers.config.fields import Section


class MetricsOptions(Section):
    """``metrics:`` — Prometheus text: ``mlaunch_step``, ``mlaunch_restarts_total``, ``mlaunch_goodput_ratio``..."""

    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="TCP port node 0's mlaunch serves /metrics on (every address of the node); the other nodes "
        "serve only mlaunch_node_info there, so every pod a scrape annotation covers answers; off when unset",
    )
