"""The observer's side of ``metrics: {port: P}``: start the server, feed it what node 0 sees, close it.

``metrics`` holds the figures and the server; this is the glue the observer calls: at start (a
node's role: the whole job on node 0 or a simulation, ``mlaunch_node_info`` elsewhere), at each
status publication (node 0's view and goodput clock), at the end. A port that cannot be bound
is said on the console, in events.jsonl and in the status view; the run goes on.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

from launchers.log import say
from launchers.observe import metrics

if TYPE_CHECKING:
    from launchers.observe.events_log import EventLog
    from launchers.observe.goodput import Goodput


class MetricsHook:
    def __init__(self, port: int, job: str, node: int, whole_job: bool, log: EventLog) -> None:
        self.job = job
        self.fold: metrics.EventFold | None = None
        self.server, error = metrics.serve(port, job, node, whole_job)
        self.state: dict[str, Any] = {"port": port, "error": error} if error else {"port": port}
        if error:
            say(f"warning: {error}; the job runs without metrics")
            log.write("metrics", port=port, error=error)
            return
        say(f"metrics: http://{socket.gethostname()}:{port}/metrics" + ("" if whole_job else " (node info only)"))
        log.write("metrics", port=port, whole_job=whole_job)
        if whole_job:
            self.fold = metrics.EventFold()
            log.on_write = self.fold.feed  # restarts by cause, hangs, commits: from what node 0 writes

    def publish(self, status: dict[str, Any], clock: Goodput) -> None:
        """Node 0's newest whole-job view and its goodput so far → the figures the next scrape reads."""
        if self.server is None or self.fold is None:
            return
        live = clock.figures(time.time())
        self.server.update(metrics.figures_from(self.job, status, live, self.fold, self.server.figures))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
