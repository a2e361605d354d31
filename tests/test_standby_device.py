"""Standbys ready for their rank's GPU (``preload_device``, issue 44 item 3).

This machine has no GPU, so CUDA is the one thing faked (``tests/scripts/fake_cuda.py``: torch.cuda's
calls make and count per-process "contexts" and log who made one on which device); everything else
is real: the warm parent that imports the list, the standbys it forks, mlaunch's supervisor that hands
them their ranks, and (last test) a real mlaunch job with a rank killed -9 and replaced in place.
What the tests hold: the warm parent never touches CUDA; each standby made its context on the device
its slot's rank uses (LOCAL_RANK, or the one device it sees) before it was handed that rank; the
rank finds it made and makes no other; a standby is never handed a rank of another device;
``preload_device: false`` touches no device.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, run_mlaunch, torch_available
from test_standby import Capture, warm_up

from launchers.plan import ProcessSpec
from launchers.run.signal_router import SignalRouter
from launchers.run.supervisor import Output, Stopping, Supervisor
from launchers.standby.device import DeviceSlot, device_slot
from launchers.standby.standby_pool import StandbyPool

SCRIPTS = ROOT / "tests" / "scripts"
sys.path.insert(0, str(SCRIPTS))

needs_torch = pytest.mark.skipif(not torch_available(), reason="needs torch")

RANK = """\
import json, os, sys
import fake_cuda, torch
at_start = fake_cuda.contexts()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())  # a script's first step
torch.cuda.synchronize()
print(json.dumps({"pid": os.getpid(), "local": int(os.environ["LOCAL_RANK"]), "at_start": at_start,
                  "after": fake_cuda.contexts(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
"""


def test_the_device_a_rank_uses_is_torchruns_convention() -> None:
    assert device_slot({"LOCAL_RANK": "3"}) == DeviceSlot(None, 3)
    assert device_slot({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "4,5"}) == DeviceSlot("4,5", 1)
    assert device_slot({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "5"}) == DeviceSlot("5", 0)  # its own GPU
    assert device_slot({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": ""}) is None  # every device hidden
    assert device_slot({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "-1"}) is None
    assert device_slot({"RANK": "0"}) is None  # names no device
    for slot in (DeviceSlot(None, 2), DeviceSlot("0,1", 1), DeviceSlot("GPU-5f1c", 0)):
        assert DeviceSlot.decode(json.loads(json.dumps(slot.encode()))) == slot  # as a fork request carries it


def _specs(tmp_path: Path, visible: list[str | None]) -> list[ProcessSpec]:
    (tmp_path / "rank.py").write_text(RANK)
    specs = []
    for local, devices in enumerate(visible):
        env = {"LOCAL_RANK": str(local), "RANK": str(local), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPTS)}
        env["FAKE_CUDA_LOG"] = str(tmp_path / "contexts.log")
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        specs.append(ProcessSpec(local, local, [sys.executable, "-u", str(tmp_path / "rank.py")], env, str(tmp_path)))
    return specs


def _contexts(tmp_path: Path) -> list[tuple[int, int, str]]:
    log = tmp_path / "contexts.log"
    lines = log.read_text().split("\n") if log.exists() else []
    return [(int(p), int(d), v) for p, d, v in (line.split() for line in lines if line)]


def _run(pool: StandbyPool, specs: list[ProcessSpec]) -> list[dict]:
    out = Capture()
    with SignalRouter() as signals:
        outcome = Supervisor(
            specs, run_id="devwarm", signals=signals, standbys=pool, stopping=Stopping(5), output=Output(out, Capture())
        ).run()
    assert outcome.status == "succeeded", out.data
    return sorted(
        (json.loads(line.split("] ", 1)[1]) for line in out.data.decode().splitlines()), key=lambda r: r["local"]
    )


@needs_torch
@pytest.mark.parametrize("visible", [[None, None], ["2", "3"]], ids=["local-rank", "one-gpu-each"])
def test_each_rank_finds_cuda_made_on_its_own_device_by_its_standby(tmp_path: Path, visible: list[str | None]) -> None:
    specs = _specs(tmp_path, visible)
    pool = StandbyPool(["fake_cuda"], run_id="devwarm", delay=0, device=True)
    try:
        warm_up(pool, specs)
        assert pool.fork and pool.parents, "the standbys were not forked from a warm parent"
        standbys = {s.pid: s for s in pool.standbys}
        assert all(s.warmed for s in standbys.values()), "a standby did not say it warmed its device"
        made = _contexts(tmp_path)
        parent = next(iter(pool.parents.values())).pid
        assert parent not in {pid for pid, _, _ in made}, "the warm parent made a CUDA context: it forks"
        assert sorted(pid for pid, _, _ in made) == sorted(standbys), made  # each standby one context, before any rank
        ranks = _run(pool, specs)
    finally:
        pool.close()
    for rank, spec in zip(ranks, specs, strict=True):
        device = 0 if visible[rank["local"]] else rank["local"]
        assert rank["pid"] in standbys, "the rank did not start from a standby"
        assert rank["at_start"] == [device], rank  # made before the hand-off, on its own device
        assert rank["after"] == [device], rank  # its own set_device made no second context
        assert (rank["pid"], device, spec.env.get("CUDA_VISIBLE_DEVICES", "-")) in made  # with its devices visible
    pids = {rank["pid"] for rank in ranks}
    assert [c for c in _contexts(tmp_path) if c[0] in pids] == [c for c in made if c[0] in pids]  # none made by a rank


@needs_torch
def test_a_standby_is_not_handed_a_rank_of_another_device(tmp_path: Path) -> None:
    """A standby warmed for device 1 is kept from the rank of device 0; ``fill`` forks one for device 0."""
    zero, one = _specs(tmp_path, [None, None])
    pool = StandbyPool(["fake_cuda"], run_id="devwarm", delay=0, device=True)
    try:
        warm_up(pool, [one])
        assert pool.take(zero) is None
        assert pool.missing([zero, one]) == [zero]
        warm_up(pool, [zero, one])
        assert sorted(s.device.index for s in pool.standbys if s.device) == [0, 1]
        for spec in (zero, one):
            taken = pool.take(spec)
            assert taken is not None and taken.device == pool.slot(spec)
            pool.standbys.append(taken)
        warm_up(pool, [zero])  # one rank left (a shrink): the standby of device 1 is not kept for it
        assert [s.device for s in pool.standbys] == [DeviceSlot(None, 0)]
    finally:
        pool.close()


@needs_torch
def test_preload_device_false_touches_no_device(tmp_path: Path) -> None:
    specs = _specs(tmp_path, [None, None])
    pool = StandbyPool(["fake_cuda"], run_id="devwarm", delay=0, device=False)
    try:
        warm_up(pool, specs)
        assert not any(s.warmed for s in pool.standbys)
        assert _contexts(tmp_path) == []
        ranks = _run(pool, specs)
    finally:
        pool.close()
    assert [r["at_start"] for r in ranks] == [[], []]  # each rank starts CUDA itself, as before
    assert sorted(pid for pid, _, _ in _contexts(tmp_path)) == sorted(r["pid"] for r in ranks)


@needs_torch
def test_a_rank_replaced_in_place_finds_cuda_made_on_its_device(tmp_path: Path) -> None:
    """A real job (1 node x 4, DDP over gloo, ``@recoverable``): rank 2 kills itself -9 at step 15. Its
    replacement starts from a standby that made its context on device 2 before the hand-off; the survivors
    keep their processes and their contexts, and make no other."""
    (tmp_path / "steps").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(
        f"entry: {SCRIPTS / 'in_place_ddp.py'}\nargs: [--fault, kill, --steps, '30', --at, '15']\nengine: pytorch\n"
        f"nodes: 1\nprocs_per_node: 4\nlog_dir: {tmp_path / 'logs'}\ncheckpoint: {{dir: {tmp_path / 'ckpt'}}}\n"
        "restart: {max_restarts: 3}\npreload: [fake_cuda, torch]\n"
        f"env: {{IN_PLACE_LOG: {tmp_path / 'steps'}, IN_PLACE_FAKE_CUDA: '1', PYTHONPATH: {SCRIPTS}, "
        f"FAKE_CUDA_LOG: {tmp_path / 'contexts.log'}}}\n"
    )
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0, rank 1, rank 3 keep their processes and rejoin in place" in result.stderr, result.stderr[-3000:]
    assert "4 warm standby workers ready for a restart (4 with CUDA initialised on their rank's device" in result.stderr
    made = _contexts(tmp_path)
    calls = {
        r: [line.split(" ", 1) for line in (tmp_path / "steps" / f"cuda{r}").read_text().splitlines()] for r in range(4)
    }
    for rank in (0, 1, 3):  # the survivors: called twice in one process, the context of the first call kept
        (pid, first), (again, second) = calls[rank]
        assert pid == again and first == f"[{rank}] [{rank}]" and second == first, calls[rank]
    (killed, _), (replacement, seen) = calls[2]
    assert replacement != killed and seen == "[2] [2]", calls[2]  # made before its script began, on device 2
    assert (int(replacement), 2, "-") in made
    assert {d for p, d, _ in made if p == int(replacement)} == {2}
    assert len({pid for pid, _, _ in made}) == len(made)  # one context a process, idle standbys' too
    assert {device for _, device, _ in made} <= {0, 1, 2, 3}  # only on the job's own devices
