"""Starting and ending processes: own process groups, the parent-death signal, the subreaper.

A worker and a warm standby are started the same way (``start_process``): in their own
session/process group, so a signal reaches them *and* whatever they started; with SIGKILL
as their parent-death signal, so they never outlive mlaunch; with their output on pipes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping

from launchers.prctl import PR_SET_CHILD_SUBREAPER, die_with_parent, prctl, resolve


def become_subreaper() -> bool:
    """Orphaned grandchildren are re-parented to us (and reaped by us) instead of to init."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def process_env(extra: Mapping[str, str], run_id: str) -> dict[str, str]:
    """mlaunch's environment, plus the process's own, plus the run's marker (what the watchdog looks for)."""
    env = dict(os.environ)
    env.update(extra)
    if run_id:
        env["MLAUNCH_RUN_ID"] = run_id
    return env


def start_process(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    parent: int,
    *,
    stdin: int = subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
    output: int = subprocess.PIPE,
) -> subprocess.Popen[bytes]:
    """Own session/process group, SIGKILL when mlaunch dies, output to pipes (``output``: elsewhere)."""

    def child_setup() -> None:
        # Runs in the forked child of a process with threads (the control plane's, a commit's): it imports
        # nothing and calls only prctl (resolved in the parent, below), signal() and getppid(),
        # so it needs no lock another thread may have held at the fork. Keep it that way.
        # Die with mlaunch even if it is SIGKILLed; if it already died, do not run at all.
        die_with_parent(signal.SIGKILL)
        # Stop signals at their defaults whatever mlaunch's own are (``mlaunch … &`` in a script ignores
        # SIGINT; a warm parent may start before mlaunch handles them): every worker, cold or forked
        # from a warm parent, begins as a fresh interpreter would and the supervisor's stop reaches it.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if os.getppid() != parent:
            os._exit(137)

    resolve()
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=output,
        stderr=output,
        start_new_session=True,
        preexec_fn=child_setup,  # noqa: PLW1509 - see below
        close_fds=True,
        pass_fds=pass_fds,
    )


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group led by ``pid`` (to the process alone where the group is not ours)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


STOPPED_STATES = frozenset("Tt")  # the /proc state letters of a stopped (or traced) process


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat``'s fields after the command name (state first); [] where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return []
    return text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses


def process_state(pid: int) -> str:
    """The process's state letter from ``/proc/PID/stat`` (R, S, D, T, t, Z...); "" where unreadable."""
    fields = stat_fields(pid)
    return fields[0][:1] if fields else ""


def signal_stop(leaders: list[int], sig: int, guarded: set[int]) -> None:
    """A stop signal to the groups led by ``leaders``, except to what a guarded process stops itself.

    A guarded process (``launchers.elastic``'s guard, see ``progress.mark_guarded``) handles
    the signal at a step boundary and ends its own children; its descendants (DataLoader
    workers) must not get it too, or they die mid-step and torch fails the rank. The others
    — each leader and its descendants — get it one by one, all in one loop after one pass
    over the process table (a process of a group that left its leader's tree still gets the
    SIGKILL at the end of the grace period).
    """
    if not guarded:
        for pid in leaders:
            signal_group(pid, sig)
        return
    try:
        children = _children_map()
    except OSError:
        children = None
    if children is None:
        for pid in leaders:
            signal_group(pid, sig)
        return
    targets: list[int] = []
    for leader in leaders:
        stack = [leader]
        while stack:
            pid = stack.pop()
            targets.append(pid)
            if pid not in guarded:  # a guarded process's descendants are its own to stop
                stack.extend(children.get(pid, ()))
    for pid in targets:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def proc_files(name: str) -> Iterator[tuple[int, bytes]] | None:
    """(pid, contents of /proc/<pid>/<name>) for every process readable now; None where there is no /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None

    def read() -> Iterator[tuple[int, bytes]]:
        for entry in entries:
            if not (entry.isascii() and entry.isdigit()):
                continue
            try:
                with open(f"/proc/{entry}/{name}", "rb") as fh:
                    yield int(entry), fh.read()
            except OSError:  # exited meanwhile, or not ours to read
                continue

    return read()


def _children_map() -> dict[int, list[int]] | None:
    """Parent pid → child pids, from one pass over /proc/<pid>/stat (None where /proc cannot be read)."""
    children: dict[int, list[int]] = {}
    stats = proc_files("stat")
    if stats is None:
        return None
    for pid, stat in stats:
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(pid)
    return children


def reap_unknown() -> None:
    """Reap any exited child (used between attempts, when no supervisor loop runs)."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break


def children_of(pid: int) -> list[int]:
    """The pids of ``pid``'s children (empty when they cannot be listed).

    One pass over /proc where it exists: psutil's import alone costs ~15 ms, and this runs as
    every job ends, on the way to mlaunch's exit.
    """
    children = _children_map()
    if children is not None:
        return children.get(pid, [])
    import psutil  # no /proc (another OS): psutil knows how

    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def kill_orphans(exclude: set[int]) -> None:
    """SIGKILL every child of this process not in ``exclude`` (the ranks, the standbys, the watchdog).

    A subreaper's children it never started are orphans a dead rank left behind. Not reaped
    here: the supervisor's loop, or ``reap_unknown``, reaps them.
    """
    for child in children_of(os.getpid()):
        if child not in exclude:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
