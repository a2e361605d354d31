"""Shared test configuration.

Slow suites (real TensorFlow / MindSpore in their own virtual environments, long chaos
runs) are marked ``@pytest.mark.slow``. They run when any of ``--slow``,
``MLAUNCH_SLOW=1`` or ``CI=true`` is set — CI runs everything with the same ``pytest``
command the README gives; a developer's plain ``pytest`` stays fast.
"""

from __future__ import annotations

import compileall
import fcntl
import os
import site
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# One OpenMP thread per process unless the developer says otherwise. The suites run several "hosts"
# and their ranks on one machine (CI: 2 cores); mlaunch leaves OMP_NUM_THREADS alone for one rank per
# node, as a real node's only process should use its cores, so here every such rank's OpenMP pool
# spin-waits beside the others: a 3-host × 1-rank DDP test spent 35 s of CPU with it, 21 s without.
os.environ.setdefault("OMP_NUM_THREADS", "1")
EXAMPLES = ROOT / "examples"
SHARED = ROOT.parent / "shared"


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's sources once, before any worker starts (the controller only).

    The suite starts thousands of Python processes — every mlaunch, rank, standby and helper
    script — and each imports ``launchers``. Where ``PYTHONDONTWRITEBYTECODE`` is set (this
    CI image sets it) none of them may cache its bytecode, so every one compiled what it
    imported again. ``compileall`` writes the caches whatever that variable says, only for
    sources newer than their cache, and every process reads them.
    """
    from cpu_log import register

    register(config)  # MLAUNCH_TEST_CPU_LOG: each test's CPU (``tests/cpu_log.py``)
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    for tree in ("launchers", "examples", "tests/scripts", "benchmarks"):
        compileall.compile_dir(str(ROOT / tree), quiet=2)  # a read-only checkout just goes without


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", help="also run @pytest.mark.slow suites")


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say when this machine has a stale pyenv rehash lock: the netns/MPI suites would wait 60 s per ssh session.

    Open MPI starts ``orted`` over ssh; the remote bash sources ~/.bashrc, whose ``pyenv init`` rehashes
    and waits up to 60 s for a lock a killed rehash left behind. ``.ci/run`` clears one older than 10 min,
    and the netns hosts one no running rehash holds (``netns.clear_killed_pyenv_lock``).
    """
    from netns import PYENV_REHASH_LOCK as lock

    if lock.exists():
        return f"WARNING: {lock} exists (a pyenv rehash lock): ssh sessions sourcing ~/.bashrc wait 60 s on it"
    return None


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for ``-n auto``: one per core, at least 2, at most 4.

    Most suites wait on real processes (timeouts, restarts, sleeping ranks), so two workers
    halve CI's wall time even on 2 cores; more than 4 would oversubscribe the multi-rank jobs.
    ``MLAUNCH_TEST_WORKERS`` overrides (``-n 0`` runs everything in this process).
    """
    if os.environ.get("MLAUNCH_TEST_WORKERS"):
        return int(os.environ["MLAUNCH_TEST_WORKERS"])
    return max(2, min(os.cpu_count() or 2, 4))


def slow_enabled(config: pytest.Config) -> bool:
    return bool(
        config.getoption("--slow")
        or os.environ.get("MLAUNCH_SLOW") == "1"
        or os.environ.get("CI", "").lower() in ("1", "true", "yes")
    )


# The files that take longest (minutes of real frameworks and netns hosts), longest first. ``-n auto
# --dist loadfile`` hands whole files to the workers in collection order: collected last, a long file
# ran alone at the end while the other worker idled (test_trainers.py: the last ~8 minutes of a run).
LONGEST_FIRST = (
    "test_trainers.py",
    "test_chaos.py",
    "test_membership_hosts.py",
    "test_chaos_storm.py",
    "test_slurm_real.py",
    "test_resume_hosts.py",
    "test_hang_auto.py",
    "test_trainers_zero3.py",
    "test_hub_moves_hosts.py",
    "test_exact_hosts.py",
    "test_replicas_hosts.py",
    "test_job_control_hosts.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def longest_first(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=longest_first)  # stable: the rest keep their order
    if slow_enabled(config):
        return
    skip = pytest.mark.skip(reason="slow suite: run with --slow, MLAUNCH_SLOW=1 or CI=true")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test marked ``machine_alone`` runs with no other test beside it; every other test shares the machine.

    ``tests/test_many_agents.py`` starts 128 mlaunch and keeps both cores busy for about a minute: a test beside
    it is starved (its waits run out) and disturbs the 128 agents' start-up, whose hub CI once found silent
    for 10 s (``tests/many_agents.py``'s ``HUB_NICE``). Each test holds a shared ``flock`` on one file of this
    pytest run (the parent of every xdist worker's base temp); a ``machine_alone`` test takes it exclusive, so it waits
    for the other worker's test to end and the other worker waits for it. The machine was saturated in
    those minutes anyway, so the run's wall time hardly changes.

    Held around the test's whole protocol, not in a fixture: a module's fixtures (``test_packaging.py``'s wheel
    build) are set up before any function fixture, and one such build ran beside the 128 agents: 552 s
    instead of 108, and the two many-agents tests 296 s and 256 s instead of about 55 (CI r56).
    """
    alone = item.get_closest_marker("machine_alone") is not None
    base = item.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    with open(base.parent / "mlaunch-tests-machine.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield


def mlaunch_cmd() -> list[str]:
    """The installed command, run with this interpreter (works in any venv)."""
    return [sys.executable, "-m", "launchers"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's env minus every platform variable, plus ``extra``.

    A developer's shell (or CI) must not turn a local-simulation test into a platform run.
    """
    platform_prefixes = (
        *("MA_", "VC_", "VK_", "PET_", "MS_", "TF_CONFIG", "RANK_TABLE_FILE", "MINDX_", "CM_"),
        *("SKYPILOT_", "JOB_COMPLETION_INDEX"),  # SkyPilot; Trainer v2's Indexed Jobs
        *("SLURM_", "SLURMD_"),  # inside a Slurm allocation
    )
    platform_names = {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "ASCEND_DEVICE_ID",
        "DEVICE_ID",
        "RANK_ID",
        "RANK_SIZE",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(platform_prefixes) and k not in platform_names}
    env.update(extra)
    return env


class BackgroundMlaunch:
    """``mlaunch ARGS`` in the background: its stdout lines as they arrive, ``wait()`` returns its stderr.

    Both pipes are read by threads only: ``communicate()`` beside a stdout reader takes part of
    stdout away from it (a "resumed from step N" line once went missing that way).
    """

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        import threading

        self.proc = subprocess.Popen(
            [*mlaunch_cmd(), *args], env=env or clean_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: list[str] = []
        self._errs: list[str] = []
        self._readers = [
            threading.Thread(target=lambda: self.lines.extend(self.proc.stdout or []), daemon=True),
            threading.Thread(target=lambda: self._errs.extend(self.proc.stderr or []), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> str:
        """Wait for mlaunch to exit; its whole stderr."""
        self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=30)
        return "".join(self._errs)


def run_mlaunch(
    args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """mlaunch run to its end; one that outlives ``timeout`` fails the test with what it printed (a hang's
    only evidence: ``TimeoutExpired`` alone shows a truncated repr of it)."""
    try:
        return subprocess.run(
            [*mlaunch_cmd(), *args],
            env=env or clean_env(),
            cwd=cwd or ROOT,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as timed_out:
        out, err = (_text(part) for part in (timed_out.stdout, timed_out.stderr))
        said = f"mlaunch ran past {timeout}s; its stderr:\n{err[-12000:]}\nstdout:\n{out[-3000:]}"
        raise AssertionError(said) from None


def _text(part: str | bytes | None) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else part or ""


def venv_seeing_this_python(path: Path, *, with_pip: bool = False) -> Path:
    """A new venv at ``path`` that also sees every package the interpreter running the tests sees.

    What ``--system-site-packages`` was meant for, but that flag shows the *base* interpreter's
    site-packages: run from a venv (or from an env built on another Python) the child would miss
    the test dependencies and mlaunch itself. Instead, a ``.pth`` file in the child's own
    site-packages adds the running interpreter's site directories (``site.getsitepackages()``,
    plus the user site where it is enabled) with ``site.addsitedir``, so their own ``.pth`` files
    (an editable mlaunch) work too. They come after the child's site-packages, as with
    ``--system-site-packages``: what is installed into the child wins. Returns the child's python.
    """
    subprocess.run(
        [sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    lines = [f"import site; site.addsitedir({d!r})\n" for d in dict.fromkeys(dirs) if os.path.isdir(d)]
    Path(purelib, "_mlaunch_tests_parent_site.pth").write_text("".join(lines))
    return python


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


needs_torch = pytest.mark.skipif(not torch_available(), reason="torch is not installed (pip install torch==2.13.0)")


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own shared-memory directory (``MLAUNCH_SHM_DIR``): what it leaves there is its own."""
    path = tmp_path / "shm"
    path.mkdir()
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(path))
    return path
