"""One run of a chaos storm's job (``python -m benchmarks.chaos``): start every host, inject, observe, end.

The loop reads every host's lines, fires each fault ``gap`` seconds after the previous one (as soon
as its target exists: a rank kill needs a rank), runs the undos when due, and watches each host's
mlaunch. Node 0's mlaunch ending is the job ending: after a fault that ends the job by design
(node 0 killed or preempted, SIGTERM to all) the harness restarts the whole job, as a platform
would, and that counts as recovered; any other end of node 0 before the last step is an
unrecoverable error (recorded, then the job is restarted whole so the storm goes on). When every
fault is in, the harness writes the end step (the newest step + ``tail``) and lets the job finish.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.inject import Injector
from benchmarks.chaos.observe import Cluster, Event, parse, says_in_job
from benchmarks.chaos.schedule import WHOLE_JOB, Fault
from launchers.elastic.format import layout

STALL = 150.0  # seconds without a step (outside a whole-job restart) that count as a stalled job
UNENDED = 60.0  # seconds past node_timeout + grace that node 0 may still run after a fault that ends the job
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
    free: float = 0.0  # when the loop was last free again after blocking (a whole-job restart)
    deadline: float | None = None  # monotonic: past it the run is cut and counted unrecoverable

    def feed(self, got: tuple[float, int, str]) -> None:
        arrival, host, line = got
        if says_in_job(line):
            self.cluster.in_job.add(host)
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
        self.last_step = time.monotonic()

    def restart_whole(self, why: str) -> None:
        """Every host's mlaunch ends (by design within node_timeout + a few s); undo every condition; start again.

        A member still running ``node_timeout`` + 15 s after node 0 ended (one that never joined node 0's
        plane waits for it, as on a platform whose pods start late) is stopped, as a platform restarting
        the job would, and noted.
        """
        deadline = time.monotonic() + self.node_timeout + 15
        for index in range(len(self.cluster.hosts)):
            code = self.cluster.wait_exit(index, max(0.1, deadline - time.monotonic()))
            if index != 0:
                self.note_exit(index, code, expected=True)
            if code is None and index != 0:
                self.rec.said.append(f"{time.monotonic():.3f} host {index} still running after node 0 ended: stopped")
        self.injector.run_undo()
        self.rec.restarts.append({"stamp": time.monotonic(), "why": why})
        self.whole_job = None
        self.start_all()
        self.free = time.monotonic()

    def note_exit(self, host: int, code: int | None, expected: bool) -> None:
        if any(e["host"] == host and e["proc"] == id(self.cluster.procs.get(host)) for e in self.rec.exits):
            return
        proc = id(self.cluster.procs.get(host))
        self.rec.exits.append(
            {"host": host, "code": code, "stamp": time.monotonic(), "expected": expected, "proc": proc}
        )

    def check_exits(self) -> None:
        for index, proc in list(self.cluster.procs.items()):
            code = proc.poll()
            if code is None or index == 0:
                continue
            expected = index in self.leaving or self.whole_job is not None or self.rec.end_written is not None
            self.note_exit(index, code, expected)
            if not expected and index not in self.leaving:
                self.leaving.add(index)  # an exit nobody caused: the platform restarts the node
                why = f"host {index}'s mlaunch ended unasked with {code}"
                self.rec.unrecoverable.append({"stamp": time.monotonic(), "host": index, "code": code, "why": why})
                print(f"  {time.monotonic():.3f} UNRECOVERABLE: {why}; started again", flush=True)
                self.cluster.wait_exit(index, 5)
                self.cluster.start(index)
                self.leaving.discard(index)

    def cut_at_deadline(self) -> None:
        """The job did not end in time: say so with every host's last lines (CI keeps nothing else)."""
        why = f"the job had not ended at the storm's deadline (frontier step {self.frontier})"
        self.rec.unrecoverable.append({"stamp": time.monotonic(), "host": -1, "code": None, "why": why})
        print(f"  {time.monotonic():.3f} UNRECOVERABLE: {why}", flush=True)
        for index in range(len(self.cluster.hosts)):
            log = self.cluster.logs / f"host{index}.log"
            lines = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
            print(f"  --- host {index}: last lines of {log}", *lines, sep="\n    ", flush=True)

    def node0_ended(self) -> bool:
        """Handle node 0's end; True when the run is over."""
        code = self.cluster.procs[0].poll()
        self.note_exit(0, code, self.whole_job is not None or self.rec.end_written is not None)
        if self.rec.end_written is not None and code == 0:
            for index in range(1, len(self.cluster.hosts)):
                left = 120.0 if self.deadline is None else max(1.0, self.deadline - time.monotonic())
                self.note_exit(index, self.cluster.wait_exit(index, min(120.0, left)), True)
            self.rec.finished = time.monotonic()
            return True
        if self.whole_job is None:
            why = f"node 0's mlaunch ended with {code} (no fault ends the job here)"
            self.rec.unrecoverable.append({"stamp": time.monotonic(), "host": 0, "code": code, "why": why})
            print(f"  {time.monotonic():.3f} UNRECOVERABLE: {why}", flush=True)
        self.restart_whole(self.whole_job or "unrecoverable")
        return False

    def not_ended(self, now: float) -> None:
        """A fault that ends the job by design did not end node 0 (a stop signal dropped): unrecoverable, restart."""
        why = f"{self.whole_job}: node 0's mlaunch still running {now - self.whole_job_at:.0f}s later"
        self.rec.unrecoverable.append({"stamp": now, "host": 0, "code": None, "why": why})
        print(f"  {now:.3f} UNRECOVERABLE: {why}", flush=True)
        for host in range(len(self.cluster.hosts)):
            self.cluster.wait_exit(host, 0.1)  # SIGKILLs its session
        self.restart_whole(self.whole_job or "unrecoverable")

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
        elif fault.kind in ("kill_mlaunch", "preempt", "link_down"):
            self.leaving.add(fault.host)
        elif fault.kind == "comeback":
            self.leaving.discard(fault.host)

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
            if not self.cluster.running(0) and self.node0_ended():
                return self.rec
            if self.deadline is not None and now > self.deadline:
                self.cut_at_deadline()
                return self.rec
            self.check_exits()
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
            if self.whole_job is not None and now - self.whole_job_at > self.node_timeout + self.grace + UNENDED:
                self.not_ended(now)
            if now - self.last_step > STALL and self.whole_job is None:
                self.rec.unrecoverable.append({"stamp": now, "host": -1, "code": None, "why": "no step for 150 s"})
                for host in range(len(self.cluster.hosts)):
                    self.cluster.wait_exit(host, 0.1)
                self.restart_whole("stalled")
