"""Whether a survivor told ``go`` is left behind in its last attempt's call: replaced, not waited for.

After a fault every survivor's watcher shuts down the failed call's connections (``elastic.in_place``), so
every collective it waits in fails within milliseconds and it leaves the call. One wait outlives that, and
it is gloo's (found on two netns hosts, ~1 kill in 20 under load, the process's native stacks taken at
the kill): a survivor's send of an all-reduce chunk went to a peer whose socket had just closed. gloo's
TCP pair does not raise on the ``EPIPE``/``ECONNRESET`` of a write (it waits for the read side to see the
close), queues the send, and when the read side does see it, its exception reaches every pending
receive and every *bound* buffer's send, but not the *unbound* buffer of a send already queued
(``tcp::Pair::signalException`` walks ``tx_`` for ``op.buf`` only). That send waits in
``UnboundBuffer::waitSend`` for the collective's timeout, 30 minutes by default, with no connection
left to end it; the main thread waits for it in DDP's ``finalize_backward`` or in ``Work::wait``. No
call from outside ends it (gloo has no abort for a collective's buffers): the process is replaced.

What tells such a survivor from a healthy one, both still without their ``go`` taken:

- the rank marks when its failed call returned (``recovery.mark_left``) and when it took its ``go``
  (``recovery.mark_joined``, before it waits, asleep, for rank 0's new store: no longer judged here; a
  wait for a rank 0 that is itself replaced ends as mlaunch supersedes the attempt);
- one that has not left but runs (its main thread runnable, or its threads' CPU time growing) is
  computing its way to the next collective, which then fails at once: waited for, up to ``LEAVE_WITHIN``;
- one that has not left and has slept, using next to no CPU, for ``ASLEEP_WITHIN`` since its ``go`` is
  in a wait nothing will end: replaced now, not ``LEAVE_WITHIN`` later.
"""

from __future__ import annotations

from dataclasses import dataclass

from launchers.procs import stat_fields

LEFT_BEHIND = "was left behind in attempt"  # a replaced survivor's failure cause starts so (``retry_policy``)
LEAVE_WITHIN = 8.0  # seconds any survivor may take to take its ``go`` (one that left its call takes it in ms)
ASLEEP_WITHIN = 1.0  # seconds a survivor still in its last call may sleep, using no CPU, after its ``go``
BUSY_TICKS = 5  # clock ticks (10 ms each) of CPU since it was last seen running that make a survivor running


@dataclass
class Told:
    """A survivor told ``go``, as its mlaunch watches it until it takes it (one owner: the supervisor)."""

    at: float  # when it was told ``go`` (monotonic)
    attempt: int  # the attempt it was told to join
    held_in: int  # the attempt whose call it must leave first
    ticks: int | None = None  # its threads' CPU time (clock ticks) when it was last seen running
    awake_at: float = 0.0  # when it was last seen running (at first: ``at``)

    def __post_init__(self) -> None:
        self.awake_at = self.awake_at or self.at


def sample(pid: int) -> tuple[str, int] | None:
    """``pid``'s main thread's state letter and the CPU time of all its threads (clock ticks); None where unreadable.

    Every thread's time, not the main thread's: a job may train in another thread, and its main thread
    would sleep in a ``join`` throughout. A survivor asleep in a collective costs its background threads
    (the watcher's 10 ms look, gloo's event loops) well under ``BUSY_TICKS`` a second; one computing,
    ``BUSY_TICKS`` within a tenth of a second or so even on a loaded machine.
    """
    fields = stat_fields(pid)
    try:
        return fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def look(told: Told, now: float, seen: tuple[str, int] | None) -> None:
    """Note whether the survivor ran since it was last seen running: its main thread runnable, or its threads
    used ``BUSY_TICKS`` of CPU since (what its background threads use asleep is less)."""
    if seen is None:
        return
    state, ticks = seen
    if told.ticks is None:
        told.ticks = ticks
    if state == "R" or ticks - told.ticks >= BUSY_TICKS:
        told.awake_at, told.ticks = now, ticks


def verdict(told: Told, now: float, left_call: bool) -> str | None:
    """Why ``told``'s survivor is replaced now (it is left behind), or None: it is waited for."""
    if now - told.at >= LEAVE_WITHIN:
        return (
            f"did not take its place in attempt {told.attempt} within {LEAVE_WITHIN:g}s (still in the last attempt's "
            "wait, which its shut-down connections did not end)"
        )
    if not left_call and now - told.awake_at >= ASLEEP_WITHIN:
        return (
            f"did not leave attempt {told.held_in}'s call within {ASLEEP_WITHIN:g}s of its go, asleep throughout "
            "(a wait its shut-down connections did not end, as gloo's send to a peer that closed first does)"
        )
    return None


def cause(told: Told) -> str:
    """The failure a replaced survivor's death is reported as: the recovery of the fault before it goes on."""
    return f"{LEFT_BEHIND} {told.held_in}'s call and was replaced (SIGKILL)"
