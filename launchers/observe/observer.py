"""The glue between the runner and what makes the job visible (status view, stragglers, events, goodput).

The runner calls ``attempt_started`` / ``tick`` (twice a second, from the supervisor's loop) /
``attempt_ended`` / ``restarting`` / ``finished``. Each node's mlaunch samples its own ranks;
the hub's node (node 0, or where the hub moved; or the simulation) keeps the whole view and judges stragglers.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from launchers.log import say
from launchers.observe import goodput, hang_limit
from launchers.observe.events_log import EventLog
from launchers.observe.persist_failures import PersistFailures
from launchers.observe.progress_log import ProgressLog
from launchers.observe.status_file import job_status, node_entry, rank_entry, write_status
from launchers.observe.steps import StepTracker

if TYPE_CHECKING:
    from launchers.config.job import Job
    from launchers.control import JobEvents, Meeting
    from launchers.health.outcome import HealthOutcome
    from launchers.observe.metrics_hook import MetricsHook
    from launchers.observe.status_relay import StatusRelay
    from launchers.observe.straggler import StragglerDetector
    from launchers.plan import LaunchPlan


class EndedFailure(Protocol):
    """What the observer reads of an attempt's failure (``run.outcome.Failure``; observe/ imports nothing of run/)."""

    label: str
    rank: int
    exit_code: int
    signal: int | None
    cause: str
    details: dict[str, Any]


class Ended(Protocol):
    """What the observer reads of an attempt's outcome (``run.outcome.Outcome``)."""

    @property
    def status(self) -> str: ...
    @property
    def failure(self) -> EndedFailure | None: ...
    @property
    def change(self) -> str: ...
    @property
    def signal(self) -> int | None: ...


STATUS_EVERY = 1.0  # seconds between status publications
SUMMARY_KEYS = ("phase", "attempt", "restarts", "last_committed_step", "stragglers")  # node 0's word to every node
MAX_SUMMARY_STRAGGLERS = 64  # ranks named in the summary (every node gets it: O(1) bytes per node)


class JobObserver:
    def __init__(self, job: Job, plan: LaunchPlan, run_id: str, events: JobEvents) -> None:
        self.job_name = job.job_name
        self.run_id = run_id
        self.events = events
        self.log_dir = Path(job.resolve(job.log_dir))
        self.simulated = plan.simulated or plan.nnodes <= 1
        self.nnodes = plan.nnodes
        self._summary: dict[str, Any] = {}
        self.node = None if self.simulated else events.node
        self.log = EventLog(self.log_dir, self.node, self.job_name)
        self.hang_timeout = job.monitor.hang_timeout  # seconds, "auto" (hang_limit learns it) or None
        self.node_timeout = job.monitor.node_timeout
        factor = job.monitor.straggler_factor
        self.detector: StragglerDetector | None = None
        if factor:  # imported only when job.yaml turns it on; it judges where the hub runs (node 0, or its successor)
            from launchers.observe.straggler import StragglerDetector

            self.detector = StragglerDetector(factor, job.monitor.straggler_steps)
        self.clock = goodput.Goodput(time.time())
        self.tracker: StepTracker | None = None
        self.attempt = 0
        self.phase = "starting"
        self._committed = -1
        self._next_status = 0.0
        self._stragglers: set[int] = set()
        self._broken = False
        self.relay: StatusRelay | None = None
        self.members: dict[str, Any] | None = None  # an elastic job's newest membership change
        self.started_over: dict[str, Any] | None = None  # an attempt that trained from scratch over committed work
        self.recompute_warnings: list[str] = []  # the goodput report's warnings (``goodput.recompute_warnings``)
        self.persist_failures = PersistFailures()  # mlaunch's own writes that failed (a full disk...)
        self.node_extra: dict[str, Any] = {}  # this node's own figures beside its ranks (persist/replication.py)
        self.progress = ProgressLog(self.log, self.clock.started)  # the steps over time, for the timeline
        self.metrics: MetricsHook | None = None
        if job.metrics.port is not None:  # imported only when job.yaml turns it on
            from launchers.observe.metrics_hook import MetricsHook

            self.metrics = MetricsHook(job.metrics.port, self.job_name, self.node or 0, not self.node, self.log)
        if not self.simulated and events.node != 0:  # `mlaunch status` here asks node 0 for the whole view
            from launchers.observe.status_relay import StatusRelay

            self.relay = StatusRelay(self.log_dir, events)

    # -- the runner's calls ---------------------------------------------------------------
    def attempt_started(self, plan: LaunchPlan, attempt: int) -> None:
        self.attempt = attempt
        self.nnodes = plan.nnodes  # an elastic job's size can change between attempts
        self.phase = "running"
        self.current = self.clock.begin(attempt, time.time())
        host = socket.gethostname()
        rank_nodes = {
            p.rank: (n.index, n.host if self.simulated else host)
            for n in plan.nodes
            for p in n.processes
            if p.role == "worker" and p.rank >= 0
        }
        self.tracker = StepTracker(self.run_id, attempt, rank_nodes)
        for r in self.tracker.ranks.values():  # what earlier attempts committed is still the job's newest commit
            r.committed_step = self._committed
        if self.detector is not None:
            self.detector.reset()
        self.log.write("start", attempt=attempt, ranks=sorted(rank_nodes), engine=plan.engine, source=plan.source)

    def tick(self) -> None:
        """Sample the ranks (twice a second); never raises: seeing the job must not break it."""
        try:
            self._tick()
        except Exception as exc:  # noqa: BLE001 - reported once, the run goes on
            if not self._broken:
                self._broken = True
                say(f"warning: the status view stopped updating: {type(exc).__name__}: {exc}")

    def _tick(self) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        tracker.sample()
        for r in tracker.ranks.values():
            self.current.note(r.first_step, r.first_wall, r.step, r.last_wall, r.saving)
        self._checkpoints(tracker)
        self._started_over(tracker)
        self.progress.sample(tracker, self.attempt)
        now = time.monotonic()
        if now >= self._next_status or (self.relay is not None and self.relay.due(now)):
            self._next_status = now + max(STATUS_EVERY, self.events.status_every)  # slower for thousands of nodes
            self._publish()

    def attempt_ended(self, outcome: Ended) -> None:
        """After the supervisor returned, before the progress files are removed."""
        self.tick()
        if self.tracker is None:
            return
        self.progress.sample(self.tracker, self.attempt, force=True)  # where the attempt's step line ends
        self.current.ended = time.time()
        phases = {"succeeded": "finished", "signalled": "stopped", "reformed": "restarting"}
        self.phase = phases.get(outcome.status, "failed")
        failure = outcome.failure
        if outcome.status == "reformed":  # an elastic job re-forms: not a failure
            self.log.write("regroup", attempt=self.attempt, cause=outcome.change)
        elif failure is not None:
            hung = bool(failure.cause and failure.cause.startswith("hung"))
            self.log.write(
                "hang" if hung else "failure",
                attempt=self.attempt,
                rank=failure.rank,
                label=failure.label,
                exit_code=failure.exit_code,
                signal=failure.signal,
                cause=failure.cause,
                **failure.details,  # a hang: the ranks outside and inside collective waits, their frames
            )
            for rank, frame in failure.details.get("frames", {}).items():  # the status view names them too
                if int(rank) in self.tracker.ranks:
                    self.tracker.ranks[int(rank)].frame = frame
        elif outcome.status == "signalled":
            self.log.write("stop", attempt=self.attempt, signal=outcome.signal)
        self._publish()

    def restarting(self, attempt: int, delay: float) -> None:
        self.phase = "restarting"
        self.log.write("restart", attempt=attempt, delay_s=delay)
        self._publish()

    @property
    def committed_step(self) -> int:
        """The newest step committed as this node saw it (-1: none yet)."""
        return self._committed

    def waiting_to_join(self) -> None:
        """A node of an elastic job that runs no ranks until it is admitted (``run/membership.py``)."""
        self.phase = "waiting to join"
        self.log.write("waiting_to_join")

    def membership(self, meeting: Meeting, before: list[int], procs_per_node: int) -> None:
        """An elastic job's membership changed (``run/membership.py``): events.jsonl, status and goodput say so."""
        change = membership_record(meeting, before, procs_per_node)
        last = self.clock.attempts[-1].last_wall if self.clock.attempts else None
        change["since_last_step_s"] = round(time.time() - last, 3) if last else None  # the time lost so far
        self.members = change
        self.clock.membership_changed()
        self.log.write("membership", **change)

    def health(self, outcome: HealthOutcome) -> None:
        """A node health check's verdicts (``launchers.health``), as events.jsonl records them."""
        self.phase = "health check"
        nodes = [{"index": v.index, "host": v.host, "verdict": v.verdict, "reason": v.reason} for v in outcome.verdicts]
        self.log.write(
            "health",
            seconds=round(outcome.seconds, 3),
            nodes=nodes,
            bad=[n["host"] for n in nodes if n["verdict"] != "ok"],
            incomplete=outcome.incomplete,
        )

    def finished(self, code: int) -> dict[str, Any]:
        """The run is over: the goodput report, printed and logged."""
        figures = self.clock.figures(time.time())
        say(goodput.describe(figures))
        for warning in figures["recompute_warnings"]:
            say(f"warning: {warning}")
            self.log.write("recomputed", cause=warning)
        self.recompute_warnings = list(figures["recompute_warnings"])
        self.log.write("end", exit_code=code, **figures)
        self.phase = "finished" if code == 0 else "failed" if self.phase != "stopped" else "stopped"
        self._publish()
        if self.metrics is not None:
            self.metrics.close()
        return figures

    # -- inside -----------------------------------------------------------------------------
    def _checkpoints(self, tracker: StepTracker) -> None:
        steps = [r.committed_step for r in tracker.ranks.values() if r.committed_step >= 0]
        newest = max(steps, default=-1)
        if newest > self._committed:
            self._committed = newest
            self.clock.committed(newest, "ranks")
            self.log.write("checkpoint", attempt=self.attempt, step=newest)

    def _started_over(self, tracker: StepTracker) -> None:
        """Ranks that train from scratch over committed work (``checkpoint.on_unreadable: start_over``): said once."""
        over = max((r.started_over for r in tracker.ranks.values()), default=-1)
        if over < 0 or (self.started_over is not None and self.started_over["attempt"] == self.attempt):
            return
        ranks = sorted(r.rank for r in tracker.ranks.values() if r.started_over >= 0)
        self.started_over = {"attempt": self.attempt, "committed_step": over, "ranks": ranks}
        say(
            f"WARNING: attempt {self.attempt} trains from scratch although step {over} is committed: no committed "
            "step could be loaded and job.yaml says checkpoint.on_unreadable: start_over (see the ranks' logs for why)"
        )
        self.log.write("started_over", **self.started_over)

    def background_committed(self, steps: list[int]) -> None:
        """Steps mlaunch itself committed (``checkpoint.persist_every``): the ranks never report these."""
        if steps:
            self.mlaunch_committed(max(steps), "background")

    def mlaunch_committed(self, step: int, source: str) -> None:
        """A step mlaunch committed for every rank (``source``: flash, background): the ranks never report it.
        On a node other than 0 it was written here and node 0 commits it ("written" counts as done there)."""
        if self.tracker is None:
            return
        for r in self.tracker.ranks.values():  # this node's ranks have it (node 0 committed it for all)
            r.committed_step = max(r.committed_step, step)
        if step > self._committed:
            self._committed = step
            self.clock.committed(step, source)
            self.log.write("checkpoint", attempt=self.attempt, step=step, source=source)

    def persist_failed(self, source: str, step: int | None, error: str) -> None:
        """A write mlaunch does for the ranks failed (``source``: flash, background): counted, one event each."""
        self.persist_failures.add(source, step, error)
        self.node_extra["persist_failures"] = dict(self.persist_failures.counts)
        self.log.write("persist_failed", attempt=self.attempt, source=source, step=step, error=error)

    def _publish(self) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        now = time.time()
        by_node: dict[int, list[dict[str, Any]]] = {}
        hosts: dict[int, str] = {}
        limit = self._hang_limit()
        for r in tracker.ranks.values():
            hung = bool(limit and r.last_wall and now - r.last_wall > limit)
            by_node.setdefault(r.node, []).append(
                rank_entry(r, now=now, straggler=r.rank in self._stragglers, hung=hung)
            )
            hosts[r.node] = r.host
        if not self.simulated:
            index = self.events.node
            verdict = {"stragglers": sorted(self._stragglers)} if self.detector is not None else {}
            host = hosts.get(index) or socket.gethostname()
            self.events.publish(node_entry(index, host, by_node.get(index, []), **verdict, **self.node_extra))
            nodes = list(self.events.view().values())
        else:
            nodes = [node_entry(i, hosts[i], ranks) for i, ranks in by_node.items()]
        self._judge(nodes)
        whole = len(nodes) >= self.nnodes  # another node holds every entry only as node 0 last sent them
        scope = "job" if self.simulated or self.events.hosting else "relay" if whole else "node"
        status = {
            "scope": scope,  # first: `mlaunch status` and a shared log directory read it from the file's head
            **job_status(
                job=self.job_name,
                run_id=self.run_id,
                phase=self.phase,
                attempt=self.attempt,
                restarts=self.attempt,
                nodes=nodes,
                stragglers=sorted(self._stragglers),
            ),
        }
        optional = {
            "control_plane": self.events.wire_stats(),  # node 0: strangers dropped on the control plane (issue 47)
            "membership": self.members,
            "started_over": self.started_over,
            "recompute_warnings": self.recompute_warnings or None,
            "persist_failures": self.persist_failures.status() or None,
            "metrics": self.metrics.state if self.metrics is not None else None,
        }
        status.update({key: value for key, value in optional.items() if value is not None})
        if not self.simulated and self.events.hosting:
            self._summarize(status)
        else:  # node 0's word on the job, beside this node's own ranks
            summary = self.events.summary()
            if "last_committed_step" in summary:
                status["last_committed_step"] = summary["last_committed_step"]
        if self.relay is None or self.relay.may_write(status):
            write_status(self.log_dir, status)
        if self.metrics is not None:
            self.metrics.publish(status, self.clock)

    def _hang_limit(self) -> float | None:
        """The silence after which the status view flags a rank ``hung``: the fixed or the learned limit."""
        if self.hang_timeout == hang_limit.AUTO:
            lost = hang_limit.others_lost_after(self.node_timeout, not self.simulated)  # as run/hang.py judges
            return hang_limit.for_run(self.run_id).limit(lost)
        return self.hang_timeout if isinstance(self.hang_timeout, float | int) else None

    def _summarize(self, status: dict[str, Any]) -> None:
        """Node 0: the job at a glance for every other node (sent on the plane when it changed)."""
        summary = {key: status.get(key) for key in SUMMARY_KEYS}
        summary["stragglers"] = sorted(self._stragglers)[:MAX_SUMMARY_STRAGGLERS]
        if summary != self._summary:
            self._summary = summary
            self.events.publish_summary(summary)

    def _judge(self, nodes: list[dict[str, Any]]) -> None:
        """Node 0 (or the simulation) judges stragglers over every rank it sees; every node learns the verdict."""
        if self.detector is None or not (self.simulated or self.events.hosting):  # the hub's node judges
            stragglers = self.events.summary().get("stragglers") if not self.simulated else None
            if isinstance(stragglers, list):
                self._stragglers = set(stragglers)
            for entry in nodes:  # the judge's verdict, as node 0 published it
                if entry.get("index") == 0 and isinstance(entry.get("stragglers"), list):
                    self._stragglers = set(entry["stragglers"])
            return
        from launchers.observe.straggler import RankSample

        samples = [
            RankSample(r["rank"], n["index"], n.get("host", ""), _int(r.get("step")), r.get("own_step_time_s"))
            for n in nodes
            for r in n.get("ranks", [])
        ]
        for change in self.detector.observe(samples):
            say(change.describe())
            self.log.write(
                "straggler" if change.slow else "straggler_recovered",
                node=change.node,
                rank=change.rank,
                host=change.host,
                step=change.step,
                own_step_time_s=round(change.step_time, 4),
                median_s=round(change.median, 4),
            )
        self._stragglers = set(self.detector.slow)


def membership_record(meeting: Meeting, before: list[int], procs_per_node: int) -> dict[str, Any]:
    """One membership change as events.jsonl and status.json say it (nodes by the platform's index)."""
    return {
        "attempt": meeting.generation,
        "members": list(meeting.members),
        "left": [{"node": x.node, "host": x.host, "why": x.why, "silent_s": round(x.seconds, 3)} for x in meeting.left],
        "joined": [{"node": node, "host": host} for node, host in meeting.joined],
        "nodes_before": len(before),
        "nodes_after": len(meeting.members),
        "world_before": len(before) * procs_per_node,
        "world_after": len(meeting.members) * procs_per_node,
        "regroup": meeting.regroup or None,
        "at": round(time.time(), 3),
    }


def _int(value: Any) -> int:
    return value if isinstance(value, int) else -1
