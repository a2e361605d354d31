"""Background persistence (``checkpoint.persist_every``): mlaunch writes staged steps while the ranks train.

The end-to-end tests run the real PyTorch example (2 simulated nodes × 2 ranks, real gloo DDP,
staging on, no ``--save-every``: the ranks never save periodically themselves) under mlaunch and
watch committed steps appear in the checkpoint directory during training. The torn-slot test
uses a real staging segment written in this process; only the moment of the overwrite is
forced (a wrapper around ``os.preadv`` re-stages mid-copy), because a real race cannot be
made to happen on demand.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, ROOT, BackgroundMlaunch, clean_env, needs_torch, run_mlaunch

from launchers.config.loader import load_job
from launchers.elastic.format import layout, shardfile
from launchers.elastic.ipc import staging
from launchers.persist import slot_copy
from launchers.persist.background_persist import BackgroundPersist
from launchers.plan import LaunchPlan
from launchers.run.runner import make_plan

sys.path.insert(0, str(ROOT / "tests" / "scripts"))
from elastic_testlib import CHAOS, children, final_checksum, wait_for  # noqa: E402

np = pytest.importorskip("numpy")
STEPS = 300


def example_job(tmp_path: Path, extra: str = "", steps: int = STEPS, args: str = "") -> Path:
    text = (EXAMPLES / "pytorch" / "job.yaml").read_text()
    text = text.replace("code_dir: .", f"code_dir: {EXAMPLES / 'pytorch'}")
    text = text.replace("dir: output/ckpt", f"dir: {tmp_path / 'ckpt'}")
    text = text.replace('args: ["--steps", "20"]', f'args: ["--steps", "{steps}"{args}]')
    text = text.replace("  keep: 3\n", f"  keep: 3\n{extra}")
    assert str(tmp_path) in text
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = tmp_path / "job.yaml"
    job.write_text(text + f"log_dir: {tmp_path / 'logs'}\n")
    return job


def test_persist_every_is_off_by_default_and_checked(tmp_path: Path) -> None:
    job = load_job(example_job(tmp_path))
    assert job.checkpoint.persist_every is None
    bad = example_job(tmp_path, extra="  persist_every: 0\n")
    with pytest.raises(Exception, match="persist_every"):
        load_job(bad)


def _torn_plan(tmp_path: Path) -> LaunchPlan:
    """A real one-rank plan (local simulation) for the persister."""
    job_path = tmp_path / "job.yaml"
    job_path.write_text("name: t\nengine: pytorch\nentry: x.py\nnodes: 1\nprocs_per_node: 1\n")
    _, _, plan = make_plan(load_job(job_path), "pytorch", simulate=True, env=clean_env())
    return plan


def test_a_slot_overwritten_during_the_copy_is_never_committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    ckpt = tmp_path / "ckpt"
    seg = staging.Segment(staging.segment_path("torn", 0), 0, 1, 0)
    seg.set_target(str(ckpt), 3)

    def stage(step: int) -> None:
        seg.stage(step, shardfile.encode({"w": np.full(1 << 16, step, dtype=np.int64)}, {"step": step}))

    real_preadv = os.preadv
    torn: list[int] = []

    def preadv_overwritten_midway(fd: int, buffers: list[memoryview], offset: int) -> int:
        """The first copy reads its first half, then the rank stages two more steps (overwriting this slot)."""
        got = real_preadv(fd, buffers, offset)
        if not torn:
            torn.append(offset)
            stage(6)
            stage(7)  # into the slot of step 5 (two slots: 7 replaces the older one)
            half = len(buffers[0]) // 2
            real_preadv(fd, [buffers[0][half:]], offset + half)  # the rest of the copy sees step 7's bytes
        return got

    monkeypatch.setattr(slot_copy.os, "preadv", preadv_overwritten_midway)
    persister = BackgroundPersist("torn", 0, _torn_plan(tmp_path), 5)
    stage(4)
    persister.tick()  # the thread starts; its first target is the multiple of 5 after step 4
    time.sleep(0.5)
    stage(5)
    assert wait_for(lambda: torn, 10)
    stage(8)
    stage(9)
    stage(10)
    assert wait_for(lambda: persister.committed, 10)
    persister.stop()
    seg.close()
    assert torn and persister.committed == [10]
    steps = [item.step for item in layout.committed(ckpt)]
    assert steps == [10]  # never step 5, whose copy was torn
    state, meta = shardfile.read_file(ckpt / layout.step_name(10) / layout.shard_name(0))
    assert meta["step"] == 10 and (state["w"] == 10).all()
    assert not [p for p in ckpt.iterdir() if p.name.endswith(".tmp")]


def _slow_storage(monkeypatch: pytest.MonkeyPatch, writing: threading.Event, delay: float = 0.2) -> None:
    """Slow storage (a fake: ``delay`` per 16 MiB piece) so that the test can act while a shard is written."""
    real_write = os.write

    def slow_write(fd: int, data: bytes | memoryview) -> int:
        writing.set()
        time.sleep(delay)
        return real_write(fd, data)

    monkeypatch.setattr(slot_copy.os, "write", slow_write)


def _staged_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: str) -> tuple[staging.Segment, Path]:
    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    seg = staging.Segment(staging.segment_path(run, 0), 0, 1, 0)
    seg.set_target(str(tmp_path / "ckpt"), 3)
    return seg, tmp_path / "ckpt"


def _big(step: int) -> shardfile.Encoded:
    return shardfile.encode({"w": np.full(8 << 20, step, dtype=np.int64)}, {"step": step})  # 64 MiB: 4 pieces


def test_stop_cancels_a_write_in_progress_and_nothing_commits_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the flash save does first at a failure or stop: the background write gives up, no commit follows."""
    seg, ckpt = _staged_segment(tmp_path, monkeypatch, "cancel")
    writing = threading.Event()
    _slow_storage(monkeypatch, writing, 0.6)  # 2.4 s for the shard
    persister = BackgroundPersist("cancel", 0, _torn_plan(tmp_path), 5)
    seg.stage(4, _big(4))
    persister.tick()
    time.sleep(0.5)
    seg.stage(5, _big(5))
    assert writing.wait(10)
    began = time.monotonic()
    persister.stop()
    assert time.monotonic() - began < 1.5  # between two pieces, not after the whole shard
    assert persister._thread is not None and not persister._thread.is_alive()
    time.sleep(0.5)
    seg.close()
    assert persister.committed == [] and not layout.committed(ckpt)
    assert not [p for p in ckpt.iterdir() if p.name.startswith("step_")]


def test_a_commit_never_outlives_the_runs_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks finish (``Checkpointer.clear()`` forgets the slots) while mlaunch writes: nothing is left."""
    seg, ckpt = _staged_segment(tmp_path, monkeypatch, "clear")
    writing = threading.Event()
    _slow_storage(monkeypatch, writing)
    persister = BackgroundPersist("clear", 0, _torn_plan(tmp_path), 5)
    seg.stage(4, _big(4))
    persister.tick()
    time.sleep(0.5)
    seg.stage(5, _big(5))
    assert writing.wait(10)
    seg.forget()  # what clear() does first; its removal of committed steps found nothing yet
    time.sleep(2.0)  # the write finishes
    persister.stop()
    seg.close()
    assert persister.committed == [] and not layout.committed(ckpt)
    assert not [p for p in ckpt.iterdir() if p.name.startswith("step_")]


def test_node_0_missing_the_first_target_removes_the_other_nodes_shards_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0's ranks staged past the first target before it was copied; node 1 wrote its shard of it. Node 0
    (which removes a step not every node wrote) had not yet learned the checkpoint directory when that first
    target was missed, and CI r74 found the other node's ``step_N.bg-*.tmp`` left behind after a two-host run.
    Node 1's mlaunch is stood in for by the exchange (the control plane's reduction, as node 0's hub returns
    it), which writes node 1's shard as that mlaunch would; node 0's segment and persister are real."""
    seg, ckpt = _staged_segment(tmp_path, monkeypatch, "missed")
    import dataclasses

    plan = _torn_plan(tmp_path)
    two_nodes = dataclasses.replace(plan, nnodes=2)  # node 0's plan of a 2-node job: only its own node listed
    rounds: list[Any] = []

    def exchange(topic: str, value: Any, deadline: float, how: Any) -> Any:
        if topic.endswith("/start"):
            return value
        tmp = ckpt / f"{layout.step_name(10)}.bg-{persister.key}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / layout.shard_name(1)).write_bytes(b"node 1's shard")  # node 1 wrote step 10
        rounds.append(value)
        return {"ok": False, "sizes": {}, "next": value["next"]}  # node 0 did not: no commit

    persister = BackgroundPersist("missed", 0, two_nodes, 5, exchange=exchange)

    def stage(step: int) -> None:
        seg.stage(step, shardfile.encode({"w": np.full(16, step, dtype=np.int64)}, {"step": step}))

    stage(7)
    persister.tick()  # first target: 10
    time.sleep(0.5)
    stage(11)
    stage(12)  # past 10 before it was seen: missed
    assert wait_for(lambda: rounds, 10)
    time.sleep(0.2)
    persister.stop()
    seg.close()
    assert rounds[0]["ok"] is False, rounds
    assert not [p.name for p in ckpt.iterdir() if p.name.endswith(".tmp")]


def _start(job: Path) -> BackgroundMlaunch:
    return BackgroundMlaunch(["--engine", "pytorch", str(job)])


def _watch(ckpt: Path, proc: subprocess.Popen[str], seen: dict[int, str]) -> None:
    """Record every committed step (and who committed it) until mlaunch exits."""
    while proc.poll() is None:
        for item in layout.committed(ckpt):
            seen.setdefault(item.step, str(item.manifest.get("source", "ranks")))
        time.sleep(0.02)


def _rank_pid(mlaunch_pid: int, rank: int) -> int | None:
    """The training process of ``rank`` — not a warm standby waiting for the next attempt.

    Found through the ranks' progress reports: a rank forked from the warm parent shows the
    parent's starting environment in /proc/<pid>/environ (no ``RANK``), as every first attempt's
    rank does now (docs/standbys.md).
    """
    from launchers.elastic.ipc import progress

    for pid in children(mlaunch_pid):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        run_id = next((v[len(b"MLAUNCH_RUN_ID=") :].decode() for v in env if v.startswith(b"MLAUNCH_RUN_ID=")), None)
        if run_id is None:
            continue
        mine = set(children(mlaunch_pid))
        for report in progress.read_run(run_id):
            if report.rank == rank and report.pid in mine and report.count > 0:
                return report.pid
    return None


@needs_torch
def test_steps_are_persisted_in_the_background_and_load(tmp_path: Path) -> None:
    reference = run_mlaunch(["--engine", "pytorch", str(example_job(tmp_path / "ref", steps=120))], timeout=300)
    assert reference.returncode == 0, reference.stderr
    job = example_job(tmp_path, "  persist_every: 5\n", steps=120, args=', "--keep-checkpoints"')
    run = _start(job)
    seen: dict[int, str] = {}
    _watch(tmp_path / "ckpt", run.proc, seen)
    err = run.wait(300)
    assert run.proc.returncode == 0, err
    assert final_checksum(run.stdout) == final_checksum(reference.stdout)
    background = sorted(step for step, source in seen.items() if source == "background")
    assert len(background) >= 3, (seen, err)  # appeared while training ran
    assert all(step % 5 == 0 for step in background)
    assert "persisted step" in err
    # mlaunch's own commits reach the status view and events.jsonl (the ranks never report them)
    events = [json.loads(line) for line in (tmp_path / "logs" / "events.jsonl").read_text().splitlines()]
    shown = [e["step"] for e in events if e.get("event") == "checkpoint" and e.get("source") == "background"]
    assert shown and all(step % 5 == 0 for step in shown), (shown, background)
    kept = layout.committed(tmp_path / "ckpt")
    assert 1 <= len(kept) <= 3  # checkpoint.keep
    for item in kept:  # every rank's shard of every kept step loads, and holds that step
        for rank in range(4):
            state, meta = shardfile.read_file(item.shard(rank))
            assert meta["step"] == item.step and meta["rank"] == rank and state["step"] == item.step


@needs_torch
def _paced(job: Path) -> Path:
    """The example through the chaos wrapper with 30 ms per step: the kill must land while it trains.

    Unpaced, a quiet machine trains the 300 steps in a few seconds and the first background step
    ≥ 20 can be seen so late that the kill hits a rank that already finished (no restart at all).
    """
    text = job.read_text().replace("entry: train.py", f"entry: {CHAOS}")
    text = text.replace("  GLOO_SOCKET_IFNAME: lo\n", '  GLOO_SOCKET_IFNAME: lo\n  CHAOS_STEP_SLEEP: "0.03"\n')
    assert str(CHAOS) in text and "CHAOS_STEP_SLEEP" in text
    job.write_text(text)
    return job


def test_resume_after_kill_minus_nine_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    reference = run_mlaunch(["--engine", "pytorch", str(_paced(example_job(tmp_path / "ref")))], timeout=300)
    assert reference.returncode == 0, reference.stderr
    extra = "  persist_every: 5\n"
    job = _paced(example_job(tmp_path, extra))
    job.write_text(job.read_text().replace("max_restarts: 0", "max_restarts: 1"))
    run = _start(job)
    seen: dict[int, str] = {}
    watcher = threading.Thread(target=_watch, args=(tmp_path / "ckpt", run.proc, seen), daemon=True)
    watcher.start()
    assert wait_for(lambda: any(s == "background" and step >= 20 for step, s in list(seen.items())), 300), seen
    pid = _rank_pid(run.pid, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    err = run.wait(300)
    watcher.join(timeout=10)
    out = run.stdout
    assert run.proc.returncode == 0, err
    assert f"rank 1 (pid {pid}) was killed by SIGKILL" in err, err  # the kill hit the training rank
    resumed = re.findall(r"resumed from step (\d+)", out)
    assert resumed and int(resumed[0]) >= 20, (out[-2000:], err[-3000:], pid)
    assert final_checksum(out) == final_checksum(reference.stdout)


@needs_torch
@pytest.mark.netns
@pytest.mark.slow
def test_two_hosts_agree_through_the_control_plane(tmp_path: Path) -> None:
    """Two real mlaunch on two netns hosts (2 ranks each): every background step is committed by node 0
    once both nodes wrote it (the control plane's exchange), and each loads on every rank."""
    from netns import NetnsHosts, netns_unavailable_reason
    from test_job_control_hosts import dump, finish, start, write_job

    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    entry = EXAMPLES / "pytorch" / "train.py"
    args = "'--steps', '80', '--keep-checkpoints', '--workers', '0'"
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    reference = run_mlaunch(
        ["--engine", "pytorch", str(write_job(ref_dir, nodes=2, procs=2, entry=entry, args=args))],
        env=clean_env(GLOO_SOCKET_IFNAME="lo"),
    )
    assert reference.returncode == 0, reference.stderr
    job = write_job(tmp_path, nodes=2, procs=2, entry=entry, args=args)
    job.write_text(job.read_text().replace("keep: 10}", "keep: 10, persist_every: 5}"))
    with NetnsHosts(2) as net:
        results = finish(start(net.hosts, job, 2))
    text = dump(results)
    assert [rc for rc, _, _ in results] == [0, 0], text
    assert final_checksum(results[0][1]) == final_checksum(reference.stdout), text
    assert "persisted step" in results[0][2] and "persisted step" not in results[1][2], text
    kept = [item for item in layout.committed(tmp_path / "ckpt") if item.manifest.get("source") == "background"]
    assert len(kept) >= 2 and all(item.step % 5 == 0 for item in kept), text
    for item in kept:
        for rank in range(4):
            state, meta = shardfile.read_file(item.shard(rank))
            assert meta["step"] == item.step and meta["rank"] == rank and state["step"] == item.step
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.endswith(".tmp")], text


def test_a_full_disk_fails_steps_counted_and_the_next_multiple_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full checkpoint filesystem (a real, small tmpfs): each step that cannot be written is handed to the
    supervisor's tick (``take_failed``: counted in status.json and events.jsonl), nothing partial stays, and once
    space is back the next multiple of ``persist_every`` commits — the run never gives up on persisting."""
    from elastic_testlib import fill, tmpfs

    monkeypatch.setenv("MLAUNCH_SHM_DIR", str(tmp_path))
    with tmpfs(tmp_path / "ckpt", "1m") as mount:
        if mount is None:
            pytest.skip("cannot mount a tmpfs here (needs root)")
        seg = staging.Segment(staging.segment_path("full", 0), 0, 1, 0)
        seg.set_target(str(mount), 3)

        def stage(step: int) -> None:
            seg.stage(step, shardfile.encode({"w": np.full(1 << 14, step, dtype=np.int64)}, {"step": step}))

        persister = BackgroundPersist("full", 0, _torn_plan(tmp_path), 5)
        filler = fill(mount)
        stage(4)
        persister.tick()
        time.sleep(0.5)
        stage(5)
        failed: list[tuple[int, str]] = []

        def some_failed() -> bool:
            failed.extend(persister.take_failed())
            return bool(failed)

        assert wait_for(some_failed, 10)
        assert failed[0][0] == 5 and "No space left on device" in failed[0][1], failed
        filler.unlink()
        for step in range(6, 11):
            stage(step)
        assert wait_for(lambda: persister.committed, 10)
        persister.stop()
        seg.close()
        assert persister.committed == [10] and [item.step for item in layout.committed(mount)] == [10]
        assert not [p for p in mount.iterdir() if p.name.endswith(".tmp")]
        assert persister.take_failed() == []  # each failure is handed over once
