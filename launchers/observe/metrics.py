"""Prometheus metrics of the running job (``metrics: {port: P}`` in job.yaml), served by node 0's mlaunch.

Node 0's mlaunch (or a simulation's) holds the whole job's view: every rank's step in the status
view, every attempt's end in its events, the goodput clock. ``JobFigures`` folds those into the
figures a cluster scrapes; ``families`` turns them into Prometheus metric families (pure, so a
test reads them without a server); ``MetricsServer`` serves them with prometheus_client's own HTTP
server on a daemon thread, read at each scrape from the newest snapshot (one reference swap: the
runner's thread never waits for a scrape). Every other node serves only ``mlaunch_node_info`` on
the same port, so a scrape annotation on every pod of a job finds each pod up.

A port that cannot be bound does not fail the run: it is said, written to events.jsonl
(``metrics`` with ``error``) and shown in the status view.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from launchers.observe.faults import restart_cause

# The job's name as a label: ``job_name``, since Prometheus owns ``job`` (the scrape job's name) and would rename
# a scraped ``job`` label to ``exported_job``.
JOB_LABEL = "job_name"


@dataclass(frozen=True)
class JobFigures:
    """What node 0 knows of the job, at one moment."""

    job: str
    node: int = 0
    whole_job: bool = True  # node 0's (or a simulation's) view; False: another node (node_info only)
    step: int | None = None  # the newest step every rank finished
    step_time_s: float | None = None  # the median of the ranks' newest interval per step
    goodput: float | None = None
    wall_s: float = 0.0
    productive_s: float | None = None
    restarts: dict[str, int] = field(default_factory=dict)  # cause → restarts it brought
    steps_lost: int = 0  # steps redone because an attempt resumed below where an earlier one reached
    checkpoint_stall_s: float = 0.0  # seconds saves blocked training (the commits' cost to the loop)
    committed_step: int | None = None
    last_commit_time: float | None = None  # wall time of the newest commit
    commits: dict[str, int] = field(default_factory=dict)  # who committed (ranks, flash, background) → how often
    nodes: int = 0
    ranks: int = 0
    stragglers: int = 0
    hangs: int = 0
    attempt: int = 0


class EventFold:
    """Restarts by cause, hangs and commits from the events node 0 writes (pure state, fed one event at a time).

    A restart is an attempt that began after another ended; its cause is the class of what ended
    the one before (``faults.fault_class``: a failure, a hang, a membership change).
    """

    def __init__(self) -> None:
        self.restarts: dict[str, int] = {}
        self.hangs = 0
        self.last_commit_time: float | None = None
        self._ends: list[dict[str, Any]] = []  # what ended the current attempt so far
        self._started = False

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "hang":
            self.hangs += 1
        elif kind == "checkpoint":
            self.last_commit_time = event.get("time")
        elif kind == "start":
            if self._started:
                cause = restart_cause(self._ends) or "unknown"
                self.restarts[cause] = self.restarts.get(cause, 0) + 1
            self._started = True
            self._ends = []
        if kind in ("failure", "hang", "regroup", "membership"):
            self._ends.append(event)


def figures_from(
    job: str, status: dict[str, Any], goodput: dict[str, Any], fold: EventFold, previous: JobFigures | None
) -> JobFigures:
    """The figures from node 0's status view and goodput clock (pure)."""
    ranks = [r for n in status.get("nodes", []) for r in n.get("ranks", [])]
    steps = [r.get("step") for r in ranks]
    step = previous.step if previous is not None else None
    if steps and all(isinstance(s, int) for s in steps):  # every rank reported: the newest step they all finished
        step = min(s for s in steps if isinstance(s, int))
    times = [r["step_time_s"] for r in ranks if isinstance(r.get("step_time_s"), (int, float))]
    step_time = statistics.median(times) if times else (previous.step_time_s if previous else None)
    return JobFigures(
        job=job,
        step=step,
        step_time_s=step_time,
        goodput=goodput.get("goodput"),
        wall_s=float(goodput.get("wall_s") or 0.0),
        productive_s=goodput.get("productive_s"),
        restarts=dict(fold.restarts),
        steps_lost=int(goodput.get("recomputed_steps") or 0),
        checkpoint_stall_s=float(goodput.get("checkpoint_stall_s") or 0.0),
        committed_step=goodput.get("committed_step"),
        last_commit_time=fold.last_commit_time,
        commits=dict(goodput.get("commits") or {}),
        nodes=len(status.get("nodes", [])),
        ranks=len(ranks),
        stragglers=len(status.get("stragglers") or []),
        hangs=fold.hangs,
        attempt=int(status.get("attempt") or 0),
    )


def families(f: JobFigures) -> Iterator[Any]:
    """The Prometheus metric families of ``f`` (every one labelled by the job's name, ``job_name``)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    job = [f.job]
    info = GaugeMetricFamily("mlaunch_node_info", "this node's mlaunch serves metrics (1)", labels=[JOB_LABEL, "node"])
    info.add_metric([f.job, str(f.node)], 1)
    yield info
    if not f.whole_job:
        return

    def gauge(name: str, text: str, value: float | None) -> Any:
        family = GaugeMetricFamily(name, text, labels=[JOB_LABEL])
        if value is not None:
            family.add_metric(job, value)
        return family

    def counter(name: str, text: str, value: float) -> Any:
        family = CounterMetricFamily(name, text, labels=[JOB_LABEL])
        family.add_metric(job, value)
        return family

    yield gauge("mlaunch_step", "the newest step every rank finished", f.step)
    restarts = CounterMetricFamily(
        "mlaunch_restarts", "restarts of the job, by what ended the attempt before", labels=[JOB_LABEL, "cause"]
    )
    for cause, count in sorted(f.restarts.items()):
        restarts.add_metric([f.job, cause], count)
    yield restarts
    yield gauge("mlaunch_goodput_ratio", "productive step time ÷ wall time so far (0..1)", f.goodput)
    yield gauge("mlaunch_step_time_seconds", "the median rank's newest time per step", f.step_time_s)
    yield gauge("mlaunch_wall_seconds", "seconds since this mlaunch started the job", f.wall_s)
    yield gauge("mlaunch_productive_seconds", "productive step time so far", f.productive_s)
    yield counter(
        "mlaunch_steps_lost", "steps redone after resuming below where an earlier attempt reached", f.steps_lost
    )
    yield counter("mlaunch_checkpoint_stall_seconds", "seconds checkpoint saves blocked training", f.checkpoint_stall_s)
    yield gauge("mlaunch_committed_step", "the newest committed checkpoint step", f.committed_step)
    yield gauge("mlaunch_last_commit_timestamp_seconds", "Unix time of the newest commit", f.last_commit_time)
    commits = CounterMetricFamily(
        "mlaunch_commits", "new newest committed steps, by who committed", labels=[JOB_LABEL, "by"]
    )
    for by, count in sorted(f.commits.items()):
        commits.add_metric([f.job, by], count)
    yield commits
    yield gauge("mlaunch_nodes", "nodes in the job's view now", f.nodes)
    yield gauge("mlaunch_ranks", "ranks in the job's view now", f.ranks)
    yield gauge("mlaunch_stragglers", "ranks reported as stragglers now", f.stragglers)
    yield counter("mlaunch_hangs", "hangs declared (monitor.hang_timeout)", f.hangs)
    yield gauge("mlaunch_attempt", "the current attempt (0: the first)", f.attempt)


class _Collector:
    def __init__(self, server: MetricsServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        yield from families(self.server.figures)


class MetricsServer:
    """prometheus_client's HTTP server on ``port`` (every address), serving the newest ``figures``."""

    def __init__(self, port: int, figures: JobFigures) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.port = port
        self.figures = figures
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        self._server, self._thread = start_http_server(port, addr="0.0.0.0", registry=registry)
        self.port = self._server.server_port  # the one bound (``port`` 0: a free one)

    def update(self, figures: JobFigures) -> None:
        self.figures = figures  # one reference: a scrape reads either the old snapshot or the new

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(port: int, job: str, node: int, whole_job: bool) -> tuple[MetricsServer | None, str | None]:
    """(the server, None), or (None, why it could not listen): the run goes on either way."""
    try:
        return MetricsServer(port, JobFigures(job=job, node=node, whole_job=whole_job)), None
    except OSError as exc:
        return None, f"cannot serve metrics on port {port}: {exc.strerror or exc}"
