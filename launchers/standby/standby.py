"""A warm standby worker: a Python process that already imported the heavy modules and waits.

A restart normally pays interpreter start-up and ``import torch`` again in every process
(seconds, on a busy node). mlaunch keeps one standby per worker instead (``preload:`` in
job.yaml): started like a worker — own process group, parent-death signal, the run's
``MLAUNCH_RUN_ID`` so the watchdog finds it — it has the listed modules imported, reports
ready, and blocks on its stdin. Most standbys are forked by the node's warm parent
(``launchers.standby.warm_parent``), which imported the list once; this module's ``main`` is the
fallback that imports the list itself (forking unsafe, or ``preload_fork: false``). When the
group restarts, the supervisor writes the worker's argv, env and cwd there; the standby
becomes that worker: same pid, same output pipes, the script run as ``__main__`` exactly as
``python -u script.py args...`` would run it.

Protocol (supervisor side in ``launchers.standby.standby_pool.StandbyPool``):
- ``MLAUNCH_STANDBY_READY_FD``: a pipe the standby writes ``R`` to once every module is
  imported (EOF without ``R``: an import failed, the standby is not used), ``RD`` when it also
  initialised CUDA on its slot's device (``launchers.standby.device``, ``MLAUNCH_STANDBY_DEVICE``);
- stdin: one JSON object ``{"argv": [...], "env": {...}, "cwd": "...", "rlimits": {...},
  "sigmask": [...], "umask": N, "wait_for_store": [host, port, seconds]}`` then EOF (rlimits,
  signal mask and umask: mlaunch's at the hand-off, what a cold worker would inherit); EOF
  with nothing means "not needed" and the standby exits 0. ``wait_for_store`` (optional) is
  set for ranks other than 0 of a torch.distributed job: see ``wait_for_listener``.
"""

from __future__ import annotations

import contextlib
import encodings.idna  # noqa: F401 - ``wait_for_listener`` encodes the host: not a lesson for the warm parent
import importlib
import json
import os
import resource
import signal
import sys
import traceback
import types

from launchers.standby.device import DEVICE_ENV, WARMED, DeviceSlot, warm_device
from launchers.standby.proc_title import set_command_line, take_back_room, without_room
from launchers.store_wait import wait_for_listener

READY_FD_ENV = "MLAUNCH_STANDBY_READY_FD"


def import_preloaded(name: str) -> None:
    """Import one ``preload:`` module and what it names as its ranks' next imports (``STANDBY_PRELOAD``).

    A package whose public names load lazily (``launchers.elastic``) lists the modules a rank
    imports right after it, so that a restarted rank does not pay for them on its way to its
    first step.
    """
    module = importlib.import_module(name)
    for follower in getattr(module, "STANDBY_PRELOAD", ()):
        importlib.import_module(follower)


def _preload(modules: list[str]) -> bool:
    for name in modules:
        try:
            import_preloaded(name)
        except BaseException:  # noqa: BLE001 - any failure means "do not use me"
            sys.stderr.write(f"mlaunch standby: cannot preload {name!r}:\n{traceback.format_exc()}")
            sys.stderr.flush()
            return False
    return True


def _ready(ready_fd: int, warmed: bool = False) -> None:
    if ready_fd >= 0:
        # The supervisor may have handed this standby a worker before it got here (and
        # closed its end): then nobody waits for "ready" any more.
        with contextlib.suppress(OSError):
            os.write(ready_fd, b"R" + (WARMED if warmed else b""))
        os.close(ready_fd)


def _read_spec() -> dict[str, object] | None:
    chunks = []
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            break
        chunks.append(data)
    raw = b"".join(chunks)
    return json.loads(raw) if raw.strip() else None


def inherit(spec: dict[str, object]) -> None:
    """mlaunch's rlimits, signal mask and umask at the hand-off: what a cold worker started then inherits."""
    limits = spec.get("rlimits")
    for name, (soft, hard) in limits.items() if isinstance(limits, dict) else ():
        number = getattr(resource, str(name), None)
        if isinstance(number, int):
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(number, (int(soft), int(hard)))
    mask = spec.get("sigmask")
    if isinstance(mask, list):
        signal.pthread_sigmask(signal.SIG_SETMASK, [signal.Signals(int(s)) for s in mask])
    umask = spec.get("umask")
    if isinstance(umask, int):
        os.umask(umask)


def become(spec: dict[str, object]) -> None:
    """Turn this process into the worker ``spec`` describes and run its script as ``__main__``."""
    argv = [str(a) for a in spec["argv"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in spec["env"].items()}  # type: ignore[attr-defined]
    inherit(spec)
    os.chdir(str(spec["cwd"]))
    os.environ.clear()
    os.environ.update(env)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - replaces the spec pipe for the script's lifetime
    if env.get("MLAUNCH_REPORT_IMPORTS") == "1":  # preload_learning: what the script imports beyond the list
        from launchers.elastic.ipc import import_report

        import_report.watch()
    script = argv[2]
    code = compile_script(script)  # while rank 0's store may not listen yet: the wait below overlaps it
    wait = spec.get("wait_for_store")
    if isinstance(wait, list) and len(wait) == 3:
        wait_for_listener(str(wait[0]), int(wait[1]), float(wait[2]))
    sys.argv = argv[2:]
    sys.orig_argv = argv  # what ``python -u script.py ...`` would show, not the standby's own command line
    set_command_line(argv)  # and what ``ps`` shows
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    run_as_main(script, code)


def compile_script(script: str) -> types.CodeType:
    """``script``'s code, as ``python script.py`` compiles it (a ``__main__`` script has no cached bytecode)."""
    with open(script, "rb") as source:
        return compile(source.read(), script, "exec", dont_inherit=True)


def run_as_main(script: str, code: types.CodeType | None = None) -> None:
    """Run ``script`` in a new ``__main__`` module that stays in ``sys.modules``, as ``python script.py`` does.

    Not ``runpy.run_path``: its temporary ``__main__`` goes away when the script ends, and the
    script's globals with it — before interpreter shutdown, with the GIL held. torch's DDP
    reducer then destroys its gloo process group, which joins a worker thread that is waiting
    for the GIL: the rank hung at its very end (seen about one run in two). Kept in
    ``sys.modules``, the globals go at shutdown, where a thread waiting for the GIL exits.
    """
    import builtins
    import importlib.machinery

    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    sys.modules["__main__"] = main
    exec(code if code is not None else compile_script(script), main.__dict__)  # noqa: S102 - this is what ``python script.py`` does


def wait_and_become(ready_fd: int, device: DeviceSlot | None = None) -> int:
    """Warm ``device`` (``preload_device``), say "ready", wait for the worker this standby is to become and become it
    (0: it was not needed).

    Both kinds of standby end here: one started as its own interpreter (``main``) and one
    forked by the warm parent (``launchers.standby.warm_parent``).
    """
    _ready(ready_fd, device is not None and warm_device(device))
    spec = _read_spec()
    if spec is None:
        return 0
    become(spec)
    return 0


def main(argv: list[str] | None = None) -> int:
    modules = without_room(list(sys.argv[1:] if argv is None else argv))
    take_back_room()
    ready_fd = int(os.environ.pop(READY_FD_ENV, "-1"))
    device = DeviceSlot.decode(os.environ.pop(DEVICE_ENV, ""))
    if not _preload(modules):
        return 3
    return wait_and_become(ready_fd, device)


if __name__ == "__main__":
    sys.exit(main())
