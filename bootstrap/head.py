"""Node 0's one process: wait for the peers, run mpirun, exit with its code.

``python -m bootstrap.head [options] -- mpirun ...`` is what the MPI engine plans on node 0;
the supervisor runs it like any rank (prefixed output, log file, SIGTERM → grace → SIGKILL).

1. Checks every host's sshd concurrently with a real SSH login (``bootstrap.readiness``),
   one overall deadline, and writes the hostfile (``address slots=N``) in node order.
2. Runs mpirun in its own process group with an environment reduced to what the job needs:
   the variables named by mpirun's ``-x`` options plus a few basics (HOME, LANG...). Ranks
   started here inherit exactly what remote ranks get; nothing else of mlaunch's
   environment — credentials included — reaches them. SIGTERM/SIGINT/SIGHUP are forwarded
   to mpirun (which stops every rank on every node); if it is still there shortly before the
   supervisor's grace period ends, it and its local ranks are SIGKILLed. mpirun also gets a
   parent-death signal, so it never outlives this wrapper.
3. Exits with mpirun's code (128+N if stopped by signal N). Node 0's mlaunch tells the
   other nodes through the job's control plane (``launchers.control``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bootstrap.hosts import render_hostfile
from bootstrap.keys import write_private
from launchers import log
from launchers.config.secrets import looks_secret
from launchers.prctl import die_with_parent
from launchers.stop_signals import STOP_SIGNALS

# Kept for mpirun beside the -x names: what a login needs, never a credential.
BASE_ENV = ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TZ", "MLAUNCH_RUN_ID")
BASE_PREFIXES = ("LC_",)
EXIT_PEERS_NOT_READY = 1
say = functools.partial(log.say, who="mlaunch mpi")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: python -m bootstrap.head [options] -- mpirun ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m bootstrap.head", description=__doc__)
    parser.add_argument("--job", required=True)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--hostfile", type=Path, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--local", action="store_true", help="one machine: no ssh, no peers")
    parser.add_argument("--hosts", default="", help="every node's host name, node 0 first, comma-separated")
    parser.add_argument("--ssh-port", type=int, default=36666)
    parser.add_argument("--user", default="")
    parser.add_argument("--key-file", type=Path)
    parser.add_argument("--known-hosts", type=Path)
    parser.add_argument("--peer-timeout", type=float, default=300.0)
    parser.add_argument("--grace", type=float, default=30.0, help="the supervisor's grace period")
    parser.add_argument("--keep-env", action="append", default=[], help="another env name mpirun keeps")
    parser.add_argument(
        "--export-prefix",
        action="append",
        default=[],
        help="also export (-x) every variable with this prefix present at run time (mlaunch's own MLAUNCH_*)",
    )
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        parser.error("no mpirun command after --")
    if not args.local and (not args.hosts or args.key_file is None or args.known_hosts is None):
        parser.error("--hosts, --key-file and --known-hosts are required unless --local")
    return args, command


def exported_names(command: list[str]) -> list[str]:
    """Names mpirun's ``-x NAME`` / ``-x NAME=VALUE`` options export to the ranks."""
    names = []
    for flag, value in zip(command, command[1:], strict=False):
        if flag == "-x":
            names.append(value.split("=", 1)[0])
    return names


# mlaunch's own plumbing: never exported to the ranks by --export-prefix MLAUNCH_.
NOT_EXPORTED = ("MLAUNCH_RUN_ID", "MLAUNCH_SSH_KEYS", "MLAUNCH_RUNTIME_DIR", "MLAUNCH_VOLCANO_DIR")


def with_prefixed_exports(command: list[str], environ: dict[str, str], prefixes: list[str]) -> list[str]:
    """Insert ``-x NAME`` for run-time variables with ``prefixes`` (added after planning, e.g. by the runner)."""
    if not prefixes:
        return command
    have = set(exported_names(command))
    extra = sorted(
        name
        for name in environ
        if name.startswith(tuple(prefixes)) and name not in have and name not in NOT_EXPORTED and not looks_secret(name)
    )
    if not extra:
        return command
    at = command.index("-x") if "-x" in command else 1  # among the options, never after the program
    options = [token for name in extra for token in ("-x", name)]
    return [*command[:at], *options, *command[at:]]


def drop_unset_exports(command: list[str], environ: dict[str, str]) -> list[str]:
    """Remove ``-x NAME`` for names this environment lacks (mpirun would only warn about them)."""
    out: list[str] = []
    skip = False
    for index, token in enumerate(command):
        if skip:
            skip = False
            continue
        following = command[index + 1] if index + 1 < len(command) else ""
        if token == "-x" and "=" not in following and following and following not in environ:
            skip = True
            continue
        out.append(token)
    return out


def mpirun_env(environ: dict[str, str], command: list[str], keep: list[str]) -> dict[str, str]:
    """The environment mpirun starts with: exported names, kept names and the basics — nothing else."""
    wanted = {*BASE_ENV, *exported_names(command), *keep}
    return {
        name: value
        for name, value in environ.items()
        if name in wanted or name.startswith(BASE_PREFIXES) or name.startswith("OMPI_MCA_")
    }


class Stopper:
    """Stop signals → a flag and an event (handlers only record; the main loop acts)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.event = threading.Event()

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signal is None:
            self.signal = signum
        self.event.set()


def _die_with_parent() -> None:
    die_with_parent(signal.SIGTERM)


def run_mpirun(command: list[str], env: dict[str, str], stopper: Stopper, grace: float) -> int:
    """Run mpirun to its end, forwarding stop signals; SIGKILL it and its ranks if it lingers."""
    say("$ " + shlex.join(command))
    try:
        proc = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
    except OSError as exc:
        say(f"cannot start {command[0]!r}: {exc.strerror or exc} (Debian/Ubuntu: apt-get install openmpi-bin)")
        return 127
    forwarded: int | None = None
    kill_at: float | None = None
    # Leave the supervisor's SIGKILL as the last resort: act a little before its grace period ends.
    own_grace = max(1.0, grace - 2.0)
    while True:
        try:
            rc = proc.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
        if stopper.signal is not None and forwarded is None:
            forwarded = stopper.signal
            say(f"forwarding {signal.Signals(forwarded).name} to mpirun (pid {proc.pid})")
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(forwarded)
            kill_at = time.monotonic() + own_grace
        if kill_at is not None and time.monotonic() >= kill_at:
            say(f"mpirun still running {own_grace:g}s after {signal.Signals(forwarded or 15).name}; SIGKILL")
            kill_tree(proc.pid)
            kill_at = None
    return 128 - rc if rc < 0 else rc


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (mpirun puts each local rank in a group of its own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for proc in family:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    stopper = Stopper()
    stopper.install()
    code: int
    hosts = [h for h in args.hosts.split(",") if h] if not args.local else []
    if args.local:
        hostfile_hosts = ["localhost"]
    else:
        assert args.key_file is not None and args.known_hosts is not None
        from bootstrap.readiness import PeersNotReady, load_client_key, load_pinned_host_key, wait_for_peers

        try:
            pkey, host_key = load_client_key(args.key_file), load_pinned_host_key(args.known_hosts)
        except Exception as exc:  # noqa: BLE001 - any unreadable/malformed key is the same user problem
            say(f"cannot load the job's keys ({args.key_file}, {args.known_hosts}): {exc}")
            return finish(EXIT_PEERS_NOT_READY)
        say(f"waiting for sshd on {len(hosts)} host(s), port {args.ssh_port} (deadline {args.peer_timeout:g}s)")
        started = time.monotonic()
        try:
            statuses = wait_for_peers(
                hosts, args.ssh_port, args.user, pkey, host_key, args.peer_timeout, stop=stopper.event
            )
        except PeersNotReady as exc:
            code = 128 + stopper.signal if stopper.signal else EXIT_PEERS_NOT_READY
            say(str(exc))
            return finish(code)
        slowest = max(statuses.values(), key=lambda s: s.elapsed)
        say(
            f"all {len(hosts)} host(s) accept the job key after {time.monotonic() - started:.2f}s "
            f"(slowest: {slowest.host} at {slowest.elapsed:.2f}s)"
        )
        hostfile_hosts = [str(statuses[h].address) for h in hosts]
    write_private(args.hostfile, render_hostfile(args.job, hostfile_hosts, args.slots).encode())
    if stopper.signal is not None:
        code = 128 + stopper.signal
    else:
        environ = dict(os.environ)
        command = drop_unset_exports(with_prefixed_exports(command, environ, args.export_prefix), environ)
        env = mpirun_env(environ, command, args.keep_env)
        code = run_mpirun(command, env, stopper, args.grace)
        if stopper.signal is not None:
            code = 128 + stopper.signal
    return finish(code)


def finish(code: int) -> int:
    """Say a non-zero code; node 0's mlaunch tells the other nodes."""
    if code:
        say(f"exit code {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
