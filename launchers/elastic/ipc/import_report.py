"""A rank's installed imports, reported to its node's mlaunch: what the warm standbys learn to preload.

mlaunch's warm parent (``launchers.standby.warm_parent``) forks standbys that already imported
``preload:``; a module the ranks import beyond that list (DDP's optimizer imports
``torch._dynamo`` on its first step: ~3 s on a busy node) is paid again after every
restart. With ``preload_learning`` on, mlaunch sets ``MLAUNCH_REPORT_IMPORTS=1`` in every
rank's environment and each rank writes, now and then, the modules it has imported that
come from an *installed* location — the interpreter's standard library or a site-packages
directory — into ``/dev/shm/mlaunch.<run_id>.progress.<pid>.imports`` (beside its progress
file, so the same sweeps remove it). Modules of the job's own code are never listed: their
import may read the rank's environment, which a standby does not have yet.

When a rank writes: ``launchers.elastic.ipc.progress`` calls ``write`` at a rank's 3rd, 30th,
300th… progress report (``should_stop``, ``stage``, ``heartbeat``); a rank that a standby
became also gets ``watch`` (an import hook that writes at most every ``WATCH_EVERY`` seconds
while the script imports new modules), for scripts that report no progress. A write is one
small file replaced atomically, and only when ``sys.modules`` grew since the last one.

Standard library only, and cheap to import: the training side imports it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from launchers.elastic.ranks import env

ENV = "MLAUNCH_REPORT_IMPORTS"
SUFFIX = ".imports"
WATCH_EVERY = 0.25  # seconds between two writes from the import hook
RETRY_BUSY = 0.05  # seconds before the import hook tries again when an import was under way

_installed: tuple[str, ...] | None = None
_own: set[str] = set()  # modules this reporting imported itself (sysconfig, site): not the script's
_verdicts: dict[str, str | None] = {}  # module name → its origin when installed, None when not
_written = -1  # len(sys.modules) at the last write
_last = 0.0
_writing = False  # a write is under way (the import hook must not start another from inside it)


def enabled() -> bool:
    return os.environ.get(ENV) == "1" and bool(env.run_id())


def report_path(run_id: str, pid: int) -> str:
    """Beside the rank's progress file (``launchers.elastic.ipc.progress.progress_path``): same directory rule."""
    shm = env.shm_dir()
    return os.path.join(shm, f"mlaunch.{run_id}.progress.{pid}{SUFFIX}")


def installed_dirs() -> tuple[str, ...]:
    """The standard library and site-packages directories of this interpreter, each ending in a separator."""
    before = set(sys.modules)
    import site
    import sysconfig

    _own.update(set(sys.modules) - before)

    paths = sysconfig.get_paths()
    found = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    with contextlib.suppress(AttributeError, OSError):
        found.update(site.getsitepackages())
    with contextlib.suppress(AttributeError, OSError):
        found.add(site.getusersitepackages())
    dirs = {os.path.join(d, "") for d in found if d}
    dirs.update(os.path.join(os.path.realpath(d), "") for d in found if d)
    return tuple(sorted(dirs))


def _origin(module: Any) -> str | None:
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) if spec is not None else None
    if not isinstance(origin, str):
        origin = getattr(module, "__file__", None)
    return origin if isinstance(origin, str) else None


def installed_origin(name: str, module: Any, dirs: Sequence[str]) -> str | None:
    """Where ``module`` comes from when that is an installed location (or built in); None otherwise."""
    if name in ("__main__", "__mp_main__") or module is None:
        return None
    origin = _origin(module)
    if origin in ("built-in", "frozen"):
        return origin
    if origin is None or not os.path.isabs(origin):
        return None  # a namespace package, or a module made in memory: nothing to tell by
    if origin.startswith(tuple(dirs)) or os.path.realpath(origin).startswith(tuple(dirs)):
        return origin
    return None


def still_importing(module: Any) -> bool:
    """Whether ``module``'s import is under way (importlib marks its spec until the module's code has run)."""
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def snapshot() -> tuple[list[tuple[str, str]], bool]:
    """(name, origin) of every installed module imported *whole* so far, in import order; and whether an
    installed module's import is still under way.

    A module half-way through its import is left out: it sits early in ``sys.modules`` (Python moves
    it to the end only when its code has run), so listing it would make the warm parent import the
    modules it had finished so far first, and name one of them (``torch._inductor.cudagraph_utils``)
    to the user instead of the module the script imported (``torch._dynamo``).
    """
    global _installed
    if _installed is None:
        _installed = installed_dirs()
    found = []
    busy = False
    for name, module in list(sys.modules.items()):
        if name in _own:
            continue
        if name not in _verdicts:
            _verdicts[name] = installed_origin(name, module, _installed)
        origin = _verdicts[name]
        if origin is None:
            continue
        if still_importing(module):
            busy = True
            continue
        found.append((name, origin))
    return found, busy


def write(path: str, whole_only: bool = False) -> bool:
    """Write this process's installed imports to ``path`` when they grew; never raises (a rank calls it).

    ``whole_only`` (the import hook): write nothing while an installed module's import is under way,
    and try again ``RETRY_BUSY`` seconds on; the report then lists the module the script imported
    rather than the first of the modules that import had finished.
    """
    global _written, _last, _writing
    if len(sys.modules) == _written or _writing:
        return False
    _writing = True
    try:
        found, busy = snapshot()
        if busy and whole_only:
            _last = time.monotonic() - WATCH_EVERY + RETRY_BUSY
            return False
        lines = "".join(f"{name}\t{origin}\n" for name, origin in found)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(lines)
        os.replace(tmp, path)
    except (OSError, ValueError, RuntimeError, ImportError):
        return False
    finally:
        _writing = False
    _written = len(sys.modules)
    _last = time.monotonic()
    return True


def write_for_this_rank() -> bool:
    """``write`` to this rank's report file when mlaunch asked for reports (a no-op otherwise)."""
    if not enabled():
        return False
    return write(report_path(env.run_id(), os.getpid()))


class _ImportWatch:
    """A meta path finder that finds nothing: it only notices that the script imports something new.

    First in ``sys.meta_path``, it is asked about each module not imported yet (never about
    one already in ``sys.modules``) and always answers None, so the import goes on exactly
    as without it; at most every ``WATCH_EVERY`` seconds it writes the report first.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if time.monotonic() - _last >= WATCH_EVERY:
            write(self.path, whole_only=True)
        return None

    def invalidate_caches(self) -> None:
        return None


def watch() -> bool:
    """Report this rank's imports as its script makes them (``launchers.standby.standby``, when asked for)."""
    if not enabled():
        return False
    global _last
    path = report_path(env.run_id(), os.getpid())
    # No write now: at its hand-off the process holds only what ``preload:`` (and the warm parent's
    # learning) imported, nothing to learn, and its first step is due; a snapshot of ~2,000 modules
    # here cost 20-60 ms of every restart, the replacement's in an in-place recovery. The first write
    # comes with the first import ``WATCH_EVERY`` seconds on, or the rank's progress reports.
    _last = time.monotonic()
    sys.meta_path.insert(0, _ImportWatch(path))
    return True


def read(path: str) -> list[tuple[str, str]]:
    """A report as written: (name, origin) pairs; empty when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            text = fh.read(16 << 20)
    except OSError:
        return []
    pairs = []
    for line in text.splitlines():
        name, sep, origin = line.partition("\t")
        if sep and name and all(part.isidentifier() for part in name.split(".")):
            pairs.append((name, origin))
    return pairs
