"""The stop flag: handlers only set it, ranks agree on it, a second signal is ignored, exit is 143.

Real signals to real processes; the agreement test runs real gloo ranks
(tests/scripts/elastic_ranks.py), one of which signals itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, needs_torch

from launchers.elastic.format import layout
from launchers.platform.cluster import free_port

RANKS = ROOT / "tests" / "scripts" / "elastic_ranks.py"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=clean_env(**env), text=True, capture_output=True, timeout=60
    )


def test_signals_only_set_the_flag_and_a_second_one_is_ignored() -> None:
    result = run_python(
        """
        import os, signal
        from launchers import elastic
        guard = elastic.install()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)   # no KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)
        print("still running", guard.received == signal.SIGTERM, guard.count, guard.should_stop(3), guard.stop_step)
        guard.exit()
        """
    )
    assert result.returncode == 143, result.stderr
    assert result.stdout.split() == ["still", "running", "True", "3", "True", "3"]
    assert "received SIGTERM; will stop at the next step boundary" in result.stderr
    assert result.stderr.count("ignored (already stopping)") == 2


def test_without_a_signal_nothing_stops_and_handlers_can_be_restored() -> None:
    result = run_python(
        """
        import signal
        from launchers import elastic
        before = signal.getsignal(signal.SIGTERM)
        guard = elastic.install()
        assert elastic.install() is guard           # idempotent
        print(any(guard.should_stop(s) for s in range(100)))
        guard.uninstall()
        print(signal.getsignal(signal.SIGTERM) is before)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_exit_is_a_system_exit_so_finally_blocks_run() -> None:
    result = run_python(
        """
        from launchers import elastic
        guard = elastic.install()
        try:
            guard.exit()
        finally:
            print("cleanup ran")
        """
    )
    assert result.returncode == 143 and "cleanup ran" in result.stdout


def test_importing_the_package_does_not_import_a_framework() -> None:
    result = run_python(
        "import sys; from launchers import elastic; "
        "print(sorted(m for m in ('torch', 'numpy', 'mindspore') if m in sys.modules))"
    )
    assert result.stdout.strip() == "[]", result.stderr


@needs_torch
@pytest.mark.parametrize("signalled", [0, 2])
def test_any_ranks_signal_stops_every_rank_at_the_same_step(tmp_path: Path, signalled: int) -> None:
    port = str(free_port())
    procs = []
    for rank in range(3):
        env = clean_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            RANK=str(rank),
            WORLD_SIZE="3",
            SIGNAL_RANK=str(signalled),
            SIGNAL_STEP="4",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(RANKS), "guard", str(tmp_path)],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [143, 143, 143], [o[1] for o in outs]
    assert [o[0].strip() for o in outs] == ["stop 4"] * 3
    for rank, (_, err) in enumerate(outs):
        if rank == signalled:
            assert "received SIGTERM" in err
        else:
            assert "another rank was signalled; stopping at step 4" in err
    committed = layout.committed(tmp_path)
    assert [c.step for c in committed] == [4]
    assert sorted(json.loads((committed[0].path / layout.MARKER).read_text())["shards"]) == ["0", "1", "2"]


def test_an_outside_sigterm_and_sigusr1_both_count() -> None:
    code = """
        import os, sys, time
        from launchers import elastic
        guard = elastic.install()
        print("ready", flush=True)
        step = 0
        while not guard.should_stop(step):
            time.sleep(0.01); step += 1
        print("stopped by", guard.received, flush=True)
        guard.exit()
    """
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=clean_env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 143, err
        assert out.strip() == f"stopped by {int(sig)}"
