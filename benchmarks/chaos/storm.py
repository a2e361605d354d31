"""One run of a chaos storm's job (``python -m benchmarks.chaos``): start every host, inject, observe, end.

The loop reads every host's lines, fires each fault ``gap`` seconds after the previous one (as soon
as its target exists: a rank kill needs a rank), runs the undos when due, and watches each host's
mlaunch. No host is special (issue 45: the hub moves): an mlaunch's end — node 0's included — is
expected when a fault took its host out (a node loss; the host stays out until its ``comeback``),
when a fault ended the whole job by design (SIGTERM to every node, after which the harness starts
every host again, as a platform would: recovered), or with 0 once the end step was written. Any other
end is an unrecoverable error: recorded, then the host is started again as its platform would (host
0 no sooner than ``NODE0_COMEBACK_FLOOR`` after it ended: the schedule's floor, for the same reason),
or the whole job when no host runs any more. When every fault is in, the harness writes the end
step (the newest step + ``tail``); the run is over once every mlaunch still running has ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.inject import Injector
from benchmarks.chaos.observe import Cluster, Event, parse, says_in_job, says_member
from benchmarks.chaos.schedule import NODE0_COMEBACK_FLOOR, NODE_LOSS, WHOLE_JOB, Fault
from launchers.elastic.format import layout

STALL = 150.0  # seconds without a step (outside a whole-job restart) that count as a stalled job
UNENDED = 60.0  # seconds past node_timeout + grace that an mlaunch may still run after a fault that ends the job
RETARGET_AFTER = 5.0  # seconds a rank or standby fault waits for its host to have one before it hits another host


@dataclass
class Record:
    """What one run saw, for report.py (plain values only)."""

    events: list[Event] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)  # host, code, stamp, expected
    restarts: list[dict[str, Any]] = field(default_factory=list)  # whole-job restarts: stamp, why
    unrecoverable: list[dict[str, Any]] = field(default_factory=list)
    end_step: int | None = None
    end_written: float | None = None
    finished: float | None = None
    said: list[str] = field(default_factory=list)


@dataclass
class Storm:
    cluster: Cluster
    injector: Injector
    ckpt: Path
    end_file: Path
    faults: list[Fault]
    node_timeout: float
    grace: float = 10.0  # the job's checkpoint.grace_period (__main__.py's job file)
    tail: int = 20
    end_step: int | None = None  # a fixed last step (the fault-free run): written before the start
    rec: Record = field(default_factory=Record)
    frontier: int = -1
    last_step: float = 0.0
    whole_job: str | None = None  # the fault that ends the job by design, pending
    whole_job_at: float = 0.0  # when it was injected
    leaving: set[int] = field(default_factory=set)  # hosts a fault took out (their exit is expected)
    restart_due: dict[int, float] = field(default_factory=dict)  # host → when the harness starts it again
    ended: list[Any] = field(default_factory=list)  # the mlaunches whose end is noted (alive: no id is reused)
    free: float = 0.0  # when the loop was last free again after blocking (a whole-job restart)
    deadline: float | None = None  # monotonic: past it the run is cut and counted unrecoverable

    def feed(self, got: tuple[float, int, str]) -> None:
        arrival, host, line = got
        if says_in_job(line):
            self.cluster.in_job.add(host)
        if says_member(line):
            self.cluster.members.add(host)
        event = parse(host, arrival, line)
        if event is None:
            if line.startswith("mlaunch:") and any(w in line for w in ("Error", "error", "cannot", "unrecoverable")):
                self.rec.said.append(f"{arrival:.3f} host {host}: {line[:300]}")
            return
        self.rec.events.append(event)
        if event.kind == "pid":
            self.injector.saw_pid(host, *event.values)
        elif event.kind == "step":
            self.frontier = max(self.frontier, event.values[0])
            self.last_step = time.monotonic()

    def pump(self, until: float) -> None:
        while (got := self.cluster.next(until - time.monotonic())) is not None:
            self.feed(got)
            if time.monotonic() >= until:
                break

    def start_all(self) -> None:
        for index in range(len(self.cluster.hosts)):
            self.cluster.start(index)
        self.leaving.clear()
        self.restart_due.clear()
        self.last_step = time.monotonic()

    def running(self) -> list[int]:
        return [h for h in range(len(self.cluster.hosts)) if self.cluster.running(h)]

    def restart_whole(self, why: str) -> None:
        """Every host's mlaunch ends (by design within node_timeout + a few s); undo every condition; start again.

        A host still running ``node_timeout`` + 15 s after the fault (one that never joined the job's
        plane waits for it, as on a platform whose pods start late) is stopped, as a platform restarting
        the job would, and noted.
        """
        deadline = time.monotonic() + self.node_timeout + 15
        for index in range(len(self.cluster.hosts)):
            was_running = self.cluster.running(index)
            code = self.cluster.wait_exit(index, max(0.1, deadline - time.monotonic()))
            self.note_exit(index, code, expected=True)
            if code is None and was_running:
                self.rec.said.append(f"{time.monotonic():.3f} host {index} still running as the job ended: stopped")
        self.injector.run_undo()
        self.rec.restarts.append({"stamp": time.monotonic(), "why": why})
        self.whole_job = None
        self.start_all()
        self.free = time.monotonic()

    def note_exit(self, host: int, code: int | None, expected: bool) -> None:
        proc = self.cluster.procs.get(host)
        if proc is None or self.noted(host):
            return
        self.ended.append(proc)
        self.rec.exits.append(
            {"host": host, "code": code, "stamp": time.monotonic(), "expected": expected, "proc": id(proc)}
        )

    def noted(self, host: int) -> bool:
        """Whether the end of host ``host``'s current mlaunch is recorded already."""
        return any(proc is self.cluster.procs.get(host) for proc in self.ended)

    def expected(self, host: int, code: int) -> bool:
        """Whether an mlaunch that ended with ``code`` ended for a reason: a fault took its host out (node 0
        too), a fault ends the whole job, or the end step was written and it ended well."""
        if host in self.leaving or self.whole_job is not None:
            return True
        return self.rec.end_written is not None and code == 0

    def check_exits(self) -> None:
        """Note every mlaunch that ended; an unasked end is unrecoverable, and its host is started again
        (host 0 after the comeback floor; the whole job when no host runs; none once the end was written)."""
        now = time.monotonic()
        for index, proc in list(self.cluster.procs.items()):
            code = proc.poll()
            if code is None or self.noted(index):
                continue
            expected = self.expected(index, code)
            self.note_exit(index, code, expected)
            if expected:
                continue
            why = f"host {index}'s mlaunch ended unasked with {code}"
            self.rec.unrecoverable.append({"stamp": now, "host": index, "code": code, "why": why})
            again = "" if self.rec.end_written is not None else "; started again"
            print(f"  {now:.3f} UNRECOVERABLE: {why}{again}", flush=True)
            if self.rec.end_written is None:
                self.leaving.add(index)  # an exit nobody caused: the platform restarts the node
                self.restart_due[index] = now + (NODE0_COMEBACK_FLOOR if index == 0 else 0.0)
        if self.restart_due and not self.running():
            self.restart_whole("unrecoverable")  # nothing runs any more: every host starts together
        for index, due in list(self.restart_due.items()):
            if now >= due:
                del self.restart_due[index]
                if not self.cluster.running(index):
                    self.cluster.start(index)
                self.leaving.discard(index)

    def over(self) -> bool:
        """The end step was written and every mlaunch has ended (how each ended, ``check_exits`` judged)."""
        return self.rec.end_written is not None and not self.running() and not self.restart_due

    def cut_at_deadline(self) -> None:
        """The job did not end in time: say so with every host's last lines (CI keeps nothing else)."""
        why = f"the job had not ended at the storm's deadline (frontier step {self.frontier})"
        self.rec.unrecoverable.append({"stamp": time.monotonic(), "host": -1, "code": None, "why": why})
        print(f"  {time.monotonic():.3f} UNRECOVERABLE: {why}", flush=True)
        for index in range(len(self.cluster.hosts)):
            log = self.cluster.logs / f"host{index}.log"
            lines = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
            print(f"  --- host {index}: last lines of {log}", *lines, sep="\n    ", flush=True)

    def whole_job_ended(self, now: float) -> None:
        """A fault that ends the job by design: once every mlaunch ended, the job starts again whole; one
        still running long after (a stop signal dropped) is unrecoverable, and the job restarts whole."""
        if self.whole_job is None:
            return
        if not self.running():
            self.restart_whole(self.whole_job)
        elif now - self.whole_job_at > self.node_timeout + self.grace + UNENDED:
            why = f"{self.whole_job}: host(s) {self.running()} still running {now - self.whole_job_at:.0f}s later"
            self.rec.unrecoverable.append({"stamp": now, "host": -1, "code": None, "why": why})
            print(f"  {now:.3f} UNRECOVERABLE: {why}", flush=True)
            for host in range(len(self.cluster.hosts)):
                self.cluster.wait_exit(host, 0.1)  # SIGKILLs its session
            self.restart_whole(self.whole_job)

    def fire(self, fault: Fault, planned: float) -> None:
        now = time.monotonic()
        entry: dict[str, Any] = {**fault.as_dict(), "planned": planned, "stamp": now}
        drawn = self.faults[fault.index].host
        if fault.host != drawn:
            entry["retargeted_from"] = drawn
        entry["committed"] = layout.newest_step(self.ckpt)
        entry["frontier"] = self.frontier
        try:
            entry["done"] = self.injector.inject(fault, now)
        except (OSError, IndexError, ValueError) as exc:
            entry["skipped"] = f"{type(exc).__name__}: {exc}"
        self.rec.faults.append(entry)
        if time.monotonic() - now > 1.0:  # it blocked (a comeback waits for the old mlaunch to end)
            self.free = time.monotonic()
        said = entry.get("done") or f"not injected: {entry.get('skipped')}"
        if "retargeted_from" in entry:
            said += f" (drawn for host {drawn}, which had none for {RETARGET_AFTER:.0f}s)"
        print(f"  {now:.3f} fault {fault.index} {fault.kind}: {said} (committed {entry['committed']})", flush=True)
        if fault.kind in WHOLE_JOB:
            self.whole_job, self.whole_job_at = fault.kind, time.monotonic()
        elif fault.kind in NODE_LOSS:  # host 0's too: it is out until its comeback, the job shrinks
            self.leaving.add(fault.host)
        elif fault.kind == "comeback":  # the injector started it again: the harness's own restart is void
            self.leaving.discard(fault.host)
            self.restart_due.pop(fault.host, None)

    def run(self, first_step_timeout: float = 300.0) -> Record:
        if self.end_step is not None:
            self.end_file.write_text(str(self.end_step))
            self.rec.end_step, self.rec.end_written = self.end_step, time.monotonic()
        self.start_all()
        deadline = time.monotonic() + first_step_timeout
        while self.frontier < 0:
            if time.monotonic() > deadline:
                raise TimeoutError("no first step")
            self.pump(time.monotonic() + 0.5)
        self.rec.said.append(f"{time.monotonic():.3f} first step")
        due, index = time.monotonic() + (self.faults[0].gap if self.faults else 0.0), 0
        settle: float | None = None
        while True:
            self.pump(time.monotonic() + 0.05)
            now = time.monotonic()
            self.injector.run_undo(now=now)
            self.check_exits()
            if self.over():
                self.rec.finished = now
                return self.rec
            if self.deadline is not None and now > self.deadline:
                self.cut_at_deadline()
                return self.rec
            self.whole_job_ended(now)
            if self.free and index < len(self.faults):  # the loop was blocked: the gap counts from now
                due = max(due, self.free + self.faults[index].gap)
                self.free = 0.0
            if index < len(self.faults) and now >= due and self.whole_job is None:
                fault = self.faults[index]
                if not self.injector.target_ready(fault) and now - due > RETARGET_AFTER:
                    fault = self.injector.retarget(fault) or fault
                if self.injector.target_ready(fault) or now - due > 60:
                    self.fire(fault, due)
                    index += 1
                    if index < len(self.faults):
                        due = time.monotonic() + self.faults[index].gap
            if index >= len(self.faults) and self.rec.end_written is None and self.whole_job is None:
                settle = settle or now
                if now - settle > 3.0 and self.last_step > settle:
                    self.injector.run_undo()
                    self.rec.end_step = self.frontier + self.tail
                    self.end_file.write_text(str(self.rec.end_step))
                    self.rec.end_written = now
            if now - self.last_step > STALL and self.whole_job is None:
                self.rec.unrecoverable.append({"stamp": now, "host": -1, "code": None, "why": "no step for 150 s"})
                for host in range(len(self.cluster.hosts)):
                    self.cluster.wait_exit(host, 0.1)
                self.restart_whole("stalled")
