"""How long a rank may be silent before it is hung (``monitor.hang_timeout``), learned from the job's own steps.

``hang_timeout: auto`` (the default) judges a rank hung when it has been silent for

    max(K × the slowest step the job has been seen to take, FLOOR)

K = 3 and FLOOR = 10 s. The slowest step is learned on each node from every rank it supervises
(cross-rank MAX: in lock-step training the fast ranks' intervals include their wait for the
slow one), checkpoint and evaluation steps included once one has been seen, and it is kept
across the restarts and re-forms of the run (a new ``mlaunch`` learns afresh: nothing is stored
on disk, so a changed job never inherits a stale limit). A process's first interval — from its
first report to the next, where a compiled model compiles and a restored one warms up — is
neither learned nor judged by it: it stays under ``monitor.start_timeout``, as does the time
before a first report.

A step much longer than any seen before (the first checkpoint, the first evaluation) is what a
learned limit gets wrong, so ``auto`` asks one more question before it judges: has the rank's
main thread run Python code within the limit? ``launchers.elastic`` asks the interpreter to run
a tiny callback every ``progress.PYTHON_EVERY`` seconds (``Py_AddPendingCall``: it runs only
between two bytecodes of the main thread), which stamps the time in the progress file. A rank
stopped (SIGSTOP), stuck in the kernel or a driver, blocked in a collective, a lock or a
``sleep`` runs no Python; a rank evaluating, saving or loading data does, at least every few
seconds (a DataLoader's wait wakes every 5 s, hence the 10 s floor). A silent rank that ran
Python within 0.6 × the limit (6 s at the floor) is *busy*: judged only after
``monitor.start_timeout``; while one is, the node declares no hang (its other ranks may be
waiting for it). A fixed ``hang_timeout`` (a duration)
keeps the plain rule: silent that long is hung.

Everything here is a pure function of what the monitor observed; ``launchers.run.hang`` applies it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from launchers.config.monitor import AUTO as AUTO  # noqa: E402 - job.yaml's word and numbers, defined with the key
from launchers.config.monitor import FLOOR as FLOOR  # noqa: E402
from launchers.config.monitor import K as K  # noqa: E402

BUSY_SHARE = 0.6  # busy: its main thread ran Python within this share of the limit (6 s at the floor)
WAITER_DEFER = 2.0  # seconds a node whose hung ranks all wait in a collective leaves to the culprit's node


def others_lost_after(node_timeout: float, several_real_nodes: bool) -> float:
    """The least silence an auto limit waits on a job of several real nodes: a lost node is told first."""
    return node_timeout + WAITER_DEFER if several_real_nodes else 0.0


@dataclass(frozen=True)
class Policy:
    """What job.yaml says: a fixed ``hang_timeout`` (seconds), ``auto``, or off (None); and ``start_timeout``."""

    hang_timeout: float | str | None
    start_timeout: float | None
    others_lost_after: float = 0.0  # a real multi-node job: node_timeout + WAITER_DEFER (the layer below first)

    @property
    def auto(self) -> bool:
        return self.hang_timeout == AUTO


@dataclass(frozen=True)
class Seen:
    """One rank at one poll, as the monitor sees it."""

    reports: int  # progress reports of this process in this attempt (0: none yet)
    silent: float  # seconds since its last report (since the attempt began when it has none)
    python_idle: float | None = None  # seconds since its main thread last ran Python (None: not known)


@dataclass(frozen=True)
class Verdict:
    """Whether a rank is hung, and the limit (and its name) it was judged against."""

    hung: bool
    limit: float | None  # None: not judged at all
    rule: str  # "start_timeout", "first_step", "hang_timeout", "auto" or "busy"


def auto_limit(slowest: float | None, others_lost_after: float = 0.0) -> float:
    """``max(K × slowest, FLOOR)`` (FLOOR while no step has been measured), and never before a lost node is told.

    On a job of several real nodes a node that died leaves the others' ranks silent in their
    collectives: ``monitor.node_timeout`` must judge that (the job shrinks) before any of them is
    judged hung (the whole job would fail), so the limit is at least ``others_lost_after``.
    """
    learned = max(K * slowest, FLOOR) if slowest is not None else FLOOR
    return max(learned, others_lost_after)


def judge(seen: Seen, policy: Policy, slowest: float | None) -> Verdict:
    """One rank's verdict: hung once silent for its limit (see the module's docstring for which)."""
    if seen.reports == 0:
        return _against(seen.silent, policy.start_timeout, "start_timeout")
    if not policy.auto:
        fixed = policy.hang_timeout if isinstance(policy.hang_timeout, float | int) else None
        return _against(seen.silent, fixed, "hang_timeout")
    if seen.reports == 1:  # its first step (compile, warm-up) is neither learned nor judged by the learned limit
        return _against(seen.silent, policy.start_timeout, "first_step")
    limit = auto_limit(slowest, policy.others_lost_after)
    # busy: ran Python within BUSY_SHARE of the limit (a rank that went on from its report into a
    # collective ran Python only up to then); from half the limit on, as ranks in lock step last
    # reported within a step (≤ limit / K) of each other: the one saving is busy by the time its
    # peers in the barrier reach the limit
    if seen.python_idle is not None and seen.python_idle < BUSY_SHARE * limit and seen.silent >= limit / 2:
        return _against(seen.silent, max(limit, policy.start_timeout or limit), "busy")
    return _against(seen.silent, limit, "auto")


def _against(silent: float, limit: float | None, rule: str) -> Verdict:
    return Verdict(limit is not None and silent >= limit, limit, rule)


def hung_on_node(verdicts: Iterable[Verdict], stopped: bool = False) -> bool:
    """Whether the node declares a hang: a rank is hung and no silent rank of the node is still busy.

    ``stopped``: a hung rank's process is stopped (``T``): it cannot be doing the work the busy
    ones wait for, so it is declared all the same. (Not ``D``: a healthy long write is in it too.)
    """
    verdicts = list(verdicts)
    busy = any(v.rule == "busy" and not v.hung for v in verdicts)
    return any(v.hung for v in verdicts) and (stopped or not busy)


def after_hang(before: tuple[int, float] | None, step: int, silence: float) -> float | None:
    """The step time to learn from a hang judged at ``step`` after ``silence`` seconds (``before``: the last one).

    A step that is simply longer than the limit (one long C call, no rank running Python) would be
    judged again after every restart, at the same step, and never learned (it never ends). When
    the hang before was judged at the same step, its silence counts as a step seen: the next limit
    is K × it. A hang at another step (a real one, after a restart) teaches nothing.
    """
    if before is None or before[0] != step or step < 0:
        return None
    return max(before[1], silence)


def interval(before: tuple[int, float] | None, now: tuple[int, float]) -> float | None:
    """The step interval to learn from two reads of one process's (report count, last report time).

    An upper bound on the longest gap between its reports in between (the gaps after the first
    one all fall within one poll). None when nothing new was reported, or when the span includes
    the process's first interval (compile and warm-up: ``start_timeout``'s business).
    """
    if before is None or now[0] <= before[0] or before[0] < 2:
        return None
    return max(0.0, now[1] - before[1])


@dataclass
class StepTimes:
    """The slowest step interval seen in a run (kept across its attempts), learned from every process's reports."""

    slowest: float | None = None
    _last: dict[int, tuple[int, float]] = field(default_factory=dict)  # pid → (count, monotonic)
    last_hang: tuple[int, float] | None = None  # (step, silence) of the last hang judged in the run

    def learn(self, pid: int, count: int, monotonic: float) -> None:
        step = interval(self._last.get(pid), (count, monotonic))
        self._last[pid] = (count, monotonic)
        if step is not None and (self.slowest is None or step > self.slowest):
            self.slowest = step

    def hung(self, step: int, silence: float) -> None:
        """A hang was judged at ``step`` after ``silence`` seconds (``after_hang``)."""
        learned = after_hang(self.last_hang, step, silence)
        if learned is not None and (self.slowest is None or learned > self.slowest):
            self.slowest = learned
        self.last_hang = (step, silence)

    def new_attempt(self) -> None:
        """The last attempt's processes are gone (their pids may come back as new ones): keep only what was learned."""
        self._last.clear()

    def limit(self, others_lost_after: float = 0.0) -> float:
        return auto_limit(self.slowest, others_lost_after)


_RUNS: dict[str, StepTimes] = {}


def for_run(run_id: str) -> StepTimes:
    """The run's learned step times: one per run, shared by its attempts' monitors and the status view."""
    return _RUNS.setdefault(run_id, StepTimes())
