"""A rank a standby became shows its own command line in ``ps``, not the standby's.

Real processes: a script started with a standby's room argument rewrites its own argument area,
and real mlaunch jobs restart ranks from forked and from exec'd standbys; ``ps``, psutil and
``/proc/<pid>/cmdline`` are read from outside or inside the rank as a user's tools would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, run_mlaunch

from launchers.standby.proc_title import room_argument

TITLED = """\
import json, os, subprocess, sys
import psutil
from launchers.standby.proc_title import set_command_line, take_back_room
environ = open("/proc/self/environ", "rb").read()
took = take_back_room()
own = psutil.Process().cmdline()
shown = set_command_line(["/venv/bin/python3", "-u", "train.py", "--lr", "0.1"])
seen = psutil.Process().cmdline()
ps = subprocess.run(["ps", "-o", "args=", "-p", str(os.getpid())], capture_output=True, text=True).stdout.strip()
long = set_command_line(["x" * 5000])
print(json.dumps({
    "took": took, "own": own, "shown": shown, "psutil": seen, "ps": ps,
    "long": long, "long_len": len(open("/proc/self/cmdline", "rb").read()),
    "environ_kept": open("/proc/self/environ", "rb").read() == environ,
}))
"""


def test_a_standby_gives_its_room_back_and_shows_the_ranks_command_line(tmp_path: Path) -> None:
    """The room argument leaves the standby's own title; the rank's command line is what ``ps`` and psutil
    read, one that does not fit is cut to the room, and ``/proc/<pid>/environ`` (the watchdog's
    ``MLAUNCH_RUN_ID``) is untouched."""
    script = tmp_path / "titled.py"
    script.write_text(TITLED)
    env = {**clean_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-u", str(script), "--keep", room_argument()], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["took"] and seen["own"] == [sys.executable, "-u", str(script), "--keep"], seen
    assert seen["shown"] and seen["psutil"] == ["/venv/bin/python3", "-u", "train.py", "--lr", "0.1"], seen
    assert seen["ps"] == "/venv/bin/python3 -u train.py --lr 0.1", seen
    assert seen["long"] and 1024 < seen["long_len"] < 5000, seen
    assert seen["environ_kept"], seen


RESTARTED = """\
import json, os, sys, time
import psutil
attempt = os.environ["MLAUNCH_RESTART_COUNT"]
print("cmdline", attempt, json.dumps(psutil.Process().cmdline()), flush=True)
if attempt == "0":
    time.sleep(3)  # the standbys are forked once the ranks spoke
    sys.exit(7 if os.environ["RANK"] == "1" else 0)
"""


@pytest.mark.parametrize("fork", ["true", "false"])
def test_restarted_ranks_show_their_own_command_line(tmp_path: Path, fork: str) -> None:
    """Restarted from a forked standby (``preload_fork: true``) or from one that imported the list itself,
    each rank shows ``python -u script.py args`` as a cold rank does (it showed the standby's)."""
    entry = tmp_path / "restarted.py"
    entry.write_text(RESTARTED)
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: restarted.py\nargs: ['--lr', '0.1']\nprocs_per_node: 2\nlog_dir: {tmp_path}/logs\n"
        f"preload: [psutil]\npreload_fork: {fork}\n"
        f"restart: {{max_restarts: 1, backoff: 0s}}\ncheckpoint: {{grace_period: 5s, dir: {tmp_path}/ckpt}}\n"
    )
    result = run_mlaunch(["--engine", "pytorch", str(job)], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "restarting the group (1/1) in 0s from 2 warm standbys" in result.stderr, result.stderr
    lines = [line.split(" cmdline ")[1].split(" ", 1) for line in result.stdout.splitlines() if " cmdline " in line]
    assert sorted(attempt for attempt, _ in lines) == ["0", "0", "1", "1"], result.stdout
    for _, shown in lines:
        assert json.loads(shown) == [sys.executable, "-u", str(entry), "--lr", "0.1"], result.stdout
