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

- the rank marks when its failed call returned (``recovery.mark_left``): one that has left may wait,
  asleep, for rank 0's new store (up to ``elastic.in_place.STORE_WAIT_SECONDS``);
- one that has not left but whose main thread runs (state R, or its CPU time grows) is computing its way
  to the next collective, which then fails at once: waited for, up to ``LEAVE_WITHIN``;
- one that has not left and whose main thread has slept without a tick of CPU since its ``go`` for
  ``ASLEEP_WITHIN`` is in a wait nothing will end: replaced now, not ``LEAVE_WITHIN`` later.
"""

from __future__ import annotations

from dataclasses import dataclass

LEFT_BEHIND = "was left behind in attempt"  # a replaced survivor's failure cause starts so (``retry_policy``)
LEAVE_WITHIN = 8.0  # seconds any survivor may take to take its ``go`` (a left one may wait ≤ 5 s for rank 0's store)
ASLEEP_WITHIN = 1.0  # seconds a survivor still in its last call may sleep, main thread idle, after its ``go``


@dataclass
class Told:
    """A survivor told ``go``, as its mlaunch watches it until it takes it (one owner: the supervisor)."""

    at: float  # when it was told ``go`` (monotonic)
    attempt: int  # the attempt it was told to join
    held_in: int  # the attempt whose call it must leave first
    ticks: int | None = None  # its main thread's CPU time (clock ticks) at the last look
    awake_at: float = 0.0  # when its main thread was last seen running (at first: ``at``)

    def __post_init__(self) -> None:
        self.awake_at = self.awake_at or self.at


def main_thread(pid: int) -> tuple[str, int] | None:
    """The state letter and CPU time (user + system clock ticks) of ``pid``'s main thread; None where unreadable."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    try:
        return fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def look(told: Told, now: float, sample: tuple[str, int] | None) -> None:
    """Note whether the survivor's main thread ran since the last look (runnable, or its CPU time grew)."""
    if sample is None:
        return
    state, ticks = sample
    if state == "R" or (told.ticks is not None and ticks != told.ticks):
        told.awake_at = now
    told.ticks = ticks


def verdict(told: Told, now: float, left_call: bool) -> str | None:
    """Why ``told``'s survivor is replaced now (it is left behind), or None: it is waited for."""
    if now - told.at >= LEAVE_WITHIN:
        return (
            f"did not take its place in attempt {told.attempt} within {LEAVE_WITHIN:g}s (still in the last attempt's "
            "wait, which its shut-down connections did not end)"
        )
    if not left_call and now - told.awake_at >= ASLEEP_WITHIN:
        return (
            f"did not leave attempt {told.held_in}'s call within {ASLEEP_WITHIN:g}s of its go, its main thread "
            "asleep throughout (a wait its shut-down connections did not end, as gloo's send to a peer that closed "
            "first does)"
        )
    return None


def cause(told: Told) -> str:
    """The failure a replaced survivor's death is reported as: the recovery of the fault before it goes on."""
    return f"{LEFT_BEHIND} {told.held_in}'s call and was replaced (SIGKILL)"
