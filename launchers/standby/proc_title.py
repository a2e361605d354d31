"""What ``ps`` shows for a rank a standby became: the rank's own command line, not the standby's.

A rank forked from the warm parent (or an exec'd standby) kept that process's command line, so
``ps``, ``pgrep -f train.py``, ``py-spy dump --pid $(pgrep -f train.py)`` and monitoring agents
saw ``python -u -m launchers.standby.warm_parent --control 5 torch ...`` for every restarted rank.
``/proc/<pid>/cmdline`` is read from the process's own argument area (``arg_start``..``arg_end``
in ``/proc/self/stat``), which the process may overwrite — what ``setproctitle`` does. A standby
is started with room to spare (``room_argument``), takes it back from its own title at once, and
writes the rank's command line there when it becomes the rank; when the last byte of the area is
not NUL the kernel shows the title up to its first NUL, so ``ps`` and psutil read the words of
the rank's command line (an argument with spaces in it reads as several, as with setproctitle).

Nothing is written unless the area's bytes are exactly what ``/proc/self/cmdline`` says they
are; ``/proc/self/environ`` (where the watchdog finds ``MLAUNCH_RUN_ID``) is never touched. The
area is read and written through ``/proc/self/mem``, not ctypes: a cold rank does not import
ctypes, and a standby's rank should not either.
"""

from __future__ import annotations

import os
import sys

ROOM = 1024  # bytes a standby's command line keeps spare for the rank's
ROOM_PREFIX = "--title-room="


def room_argument() -> str:
    """An argument that only reserves room in the argument area (a standby drops it from its argv)."""
    return ROOM_PREFIX + "." * ROOM


def without_room(argv: list[str]) -> list[str]:
    return [a for a in argv if not a.startswith(ROOM_PREFIX)]


_checked: tuple[int, int] | None = None  # the area, once matched against /proc/self/cmdline (a fork inherits it)


def _stat_area() -> tuple[int, int] | None:
    """(arg_start, arg_end) of this process: ``/proc/self/stat`` fields 48 and 49."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(b")") + 2 :].split()  # the fields after ``comm``, from field 3 on
        return int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return None


def _argument_area() -> tuple[int, int] | None:
    """The argument area, if it holds exactly what ``/proc/self/cmdline`` showed when first asked."""
    global _checked
    area = _stat_area()
    if area is None or not 0 < area[0] < area[1]:
        return None
    if _checked is None:
        try:
            with open("/proc/self/cmdline", "rb") as handle:
                shown = handle.read()
        except OSError:
            return None
        if area[1] - area[0] != len(shown) or _memory(area[0], len(shown)) != shown:
            return None
        _checked = area
    return area if area == _checked else None


def _memory(address: int, size: int, data: bytes | None = None) -> bytes | None:
    """Read ``size`` bytes of this process's memory at ``address``, or write ``data`` there; None: could not."""
    try:
        fd = os.open("/proc/self/mem", os.O_RDWR if data is not None else os.O_RDONLY)
    except OSError:
        return None
    try:
        if data is None:
            return os.pread(fd, size, address)
        return data if os.pwrite(fd, data, address) == len(data) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def set_command_line(argv: list[str]) -> bool:
    """Show ``argv`` as this process's command line (truncated to the room there is); False: left as it was."""
    area = _argument_area()
    if area is None:
        return False
    start, end = area
    room = end - start
    title = " ".join(argv).encode(errors="replace")[: room - 1]
    # a last byte that is not NUL: the kernel shows up to the first NUL (a title that fills the room ends in
    # NUL, and reads as one argument that psutil and ps split at its spaces)
    data = title + b"\0" + b" " * (room - len(title) - 1)
    return _memory(start, room, data) is not None


def take_back_room() -> bool:
    """A standby's own title, without the room argument (``ps`` shows it as it was started, less that)."""
    return set_command_line(without_room(list(getattr(sys, "orig_argv", sys.argv))))
