"""A worker whose behaviour the supervisor tests choose through env (no torch needed).

BEHAVE_<RANK> (or BEHAVE) is a comma list of actions, run in order:
  exit:N          exit with code N
  sleep:S         sleep S seconds
  print:TEXT      print TEXT to stdout
  stderr:TEXT     print TEXT to stderr
  fail_first:N    exit N when MLAUNCH_RESTART_COUNT is 0
  kill9           SIGKILL itself
  ignore_term     ignore SIGTERM from now on
  grandchild      start a grandchild (sleep 300) in the same process group
  escapee         start a grandchild that calls setsid() (leaves the group) and sleeps
  forever         sleep until a signal arrives
On SIGTERM it appends "TERM <rank>" to $BEHAVE_MARKS (if set) and exits 143.
It always writes its pid (and the pids of grandchildren) to $BEHAVE_PIDS/<rank>.pids.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

rank = os.environ.get("RANK", "?")
marks = os.environ.get("BEHAVE_MARKS")
pid_dir = os.environ.get("BEHAVE_PIDS")


def record_pid(pid: int) -> None:
    if pid_dir:
        with open(os.path.join(pid_dir, f"{rank}.pids"), "a") as fh:
            fh.write(f"{pid}\n")


def on_term(signum: int, frame: object) -> None:
    if marks:
        with open(marks, "a") as fh:
            fh.write(f"TERM {rank}\n")
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
record_pid(os.getpid())
actions = os.environ.get(f"BEHAVE_{rank}", os.environ.get("BEHAVE", "exit:0")).split(",")
for action in actions:
    name, _, arg = action.partition(":")
    if name == "exit":
        sys.exit(int(arg))
    elif name == "sleep":
        time.sleep(float(arg))
    elif name == "print":
        print(arg, flush=True)
    elif name == "stderr":
        print(arg, file=sys.stderr, flush=True)
    elif name == "fail_first":
        if os.environ.get("MLAUNCH_RESTART_COUNT") == "0":
            sys.exit(int(arg))
    elif name == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    elif name == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif name == "grandchild":
        child = subprocess.Popen(["sleep", "300"])
        record_pid(child.pid)
    elif name == "escapee":
        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        record_pid(child.pid)
    elif name == "forever":
        while True:
            time.sleep(1)
sys.exit(0)
