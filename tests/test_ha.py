"""High availability: MindIO TFT env, the refusals, and the TaskD manager as a real side process.

TaskD itself cannot be installed here (it ships with MindCluster; the PyPI package named
``taskd`` is unrelated), so these tests put a FAKE ``taskd`` package on the import path
(``tests/fake_taskd``): same import names, it records every call with the caller's pid.
Its ``libtaskd.so`` is compiled here as a real, empty shared library when a C compiler
exists, so ``LD_PRELOAD`` really loads it. The CANN toolkit is faked by a directory holding
``lib64/libmspti.so`` for the one test that needs it. Everything else is real: plans from
the real engines, ``mlaunch`` subprocesses, real signals.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, clean_env, mlaunch_cmd, run_mlaunch

from launchers.config.job import load_job
from launchers.engines.high_availability import MINDSPEED_FLAGS, TASKD_ROLE
from launchers.errors import UserError
from launchers.plan import LaunchPlan
from launchers.run.runner import make_plan

FAKE_TASKD = Path(__file__).resolve().parent / "fake_taskd"


# ----------------------------------------------------------------------------------------
# fixtures
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fake_taskd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fake taskd package; its libtaskd.so is a real (empty) shared library when cc exists."""
    root = tmp_path_factory.mktemp("fake-taskd")
    shutil.copytree(FAKE_TASKD / "taskd", root / "taskd", ignore=shutil.ignore_patterns("__pycache__"))
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler:
        source = root / "empty.c"
        source.write_text("int mlaunch_fake_taskd_loaded = 1;\n")
        lib = root / "taskd" / "python" / "cython_api" / "libs" / "libtaskd.so"
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True)
    return root


@pytest.fixture
def on_path(fake_taskd: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake taskd importable by this process (in-process plans look it up with find_spec)."""
    monkeypatch.syspath_prepend(str(fake_taskd))
    yield fake_taskd


def write_job(
    tmp_path: Path, ha: str, *, engine: str = "pytorch", nodes: int = 2, procs: int = 2, extra: str = ""
) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: ha-test\nentry: train.py\nengine: {engine}\nnodes: {nodes}\nprocs_per_node: {procs}\n"
        f"{extra}high_availability: {ha}\n"
    )
    return path


def plan_of(job_file: Path, env: dict[str, str] | None = None, engine: str | None = None) -> LaunchPlan:
    job = load_job(job_file)
    return make_plan(job, engine or job.engine or "pytorch", [], env or {})[2]


def workers(plan: LaunchPlan) -> list[Any]:
    return [p for p in plan.processes if p.role != TASKD_ROLE]


def managers(plan: LaunchPlan) -> list[tuple[int, Any]]:
    return [(n.index, p) for n in plan.nodes for p in n.processes if p.role == TASKD_ROLE]


def ascend_available() -> bool:
    try:
        from launchers.engines import get_engine

        get_engine("ascend")
    except Exception:
        return False
    return True


needs_ascend = pytest.mark.skipif(
    not ascend_available(), reason="the ascend engine (launchers/engines/ascend.py) is missing"
)


# ----------------------------------------------------------------------------------------
# MindIO TFT env
# ----------------------------------------------------------------------------------------


@needs_ascend
@pytest.mark.parametrize(
    ("features", "expected"),
    [
        ("ttp: true", "{TTP:1}"),
        ("uce: true", "{TTP:1,UCE:1}"),
        ("arf: true", "{TTP:1,ARF:1}"),
        ("uce: true, arf: true", "{TTP:1,UCE:1,ARF:1}"),
        ("ttp: true, uce: true, arf: true", "{TTP:1,UCE:1,ARF:1}"),
    ],
)
def test_tft_env_for_each_feature_combination(tmp_path: Path, features: str, expected: str) -> None:
    job_file = write_job(tmp_path, f"{{{features}, dp: 2, tp: 2}}", engine="ascend", extra="ascend: {style: msrun}\n")
    plan = plan_of(job_file)
    assert len(plan.processes) >= 4
    for proc in plan.processes:  # scheduler and workers alike
        assert proc.env["MINDIO_FOR_MINDSPORE"] == "1"
        assert proc.env["MS_ENABLE_TFT"] == expected
        assert proc.env["MS_TFT_IP"] == "127.0.0.1" and proc.env["MS_TFT_PORT"] == "30051"
        assert "LD_PRELOAD" not in proc.env  # no TaskD asked for
    assert not managers(plan)


@needs_ascend
def test_tft_controller_defaults_to_node_0_on_a_platform_and_can_be_given(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, "{ttp: true, dp: 4}", engine="ascend", extra="ascend: {style: msrun}\n")
    # MindCluster MindSpore env of pod 1 (of 2 × 2): the scheduler (node 0) is at MS_SCHED_HOST.
    env = {
        "MS_SCHED_HOST": "10.1.0.7",
        "MS_SCHED_PORT": "8118",
        "MS_WORKER_NUM": "4",
        "MS_LOCAL_WORKER": "2",
        "MS_NODE_RANK": "1",
        "MS_ROLE": "MS_WORKER",
    }
    plan = plan_of(job_file, env)
    assert [n.index for n in plan.nodes] == [1]
    assert {p.env["MS_TFT_IP"] for p in plan.processes} == {"10.1.0.7"}
    job = load_job(job_file)
    job.high_availability.controller = "tft-controller.ns.svc:40000"
    plan = make_plan(job, "ascend", [], env)[2]
    assert {(p.env["MS_TFT_IP"], p.env["MS_TFT_PORT"]) for p in plan.processes} == {("tft-controller.ns.svc", "40000")}


def test_job_yaml_env_wins_over_the_defaults(tmp_path: Path) -> None:
    if not ascend_available():
        pytest.skip("the ascend engine (launchers/engines/ascend.py) is missing")
    job_file = write_job(
        tmp_path, "{ttp: true, dp: 4}", engine="ascend", extra="ascend: {style: msrun}\nenv: {MS_TFT_PORT: '31000'}\n"
    )
    assert {p.env["MS_TFT_PORT"] for p in plan_of(job_file).processes} == {"31000"}


def test_pytorch_jobs_get_a_note_not_mindspore_env(tmp_path: Path) -> None:
    plan = plan_of(write_job(tmp_path, "{ttp: true, dp: 4}"))
    assert all("MS_ENABLE_TFT" not in p.env for p in plan.processes)
    assert any("taskd: true" in note for note in plan.notes)


def test_bad_controller_is_a_job_file_error(tmp_path: Path) -> None:
    result = run_mlaunch(["plan", str(write_job(tmp_path, "{ttp: true, dp: 4, controller: 'a:b:c'}"))])
    assert result.returncode == 2
    assert "high_availability.controller" in result.stderr and "HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------------------
# refusals (before anything is launched)
# ----------------------------------------------------------------------------------------


def marker_job(tmp_path: Path, ha: str) -> tuple[Path, Path]:
    """A job whose start file leaves a marker: a refused run must not create it."""
    marker = tmp_path / "started"
    (tmp_path / "train.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"entry: train.py\nengine: pytorch\nnodes: 2\nprocs_per_node: 2\nhigh_availability: {ha}\n")
    return job, marker


@pytest.mark.parametrize(
    ("ha", "names"),
    [
        ("{ttp: true}", ["set high_availability.dp", "dp × tp × pp = 4"]),
        ("{ttp: true, dp: 1, tp: 4}", ["dp (data_parallel)", "= 1 replica", "set dp"]),
        ("{uce: true, dp: 4, optimizer_shard: 4}", ["optimizer_shard", "raise dp to at least 8"]),
        ("{arf: true, dp: 2, tp: 4}", ["dp × tp × pp = 2 × 4 × 1 = 8, but the job runs 4 processes"]),
        ("{ttp: true, dp: 4, sink_size: 2}", ["high_availability.sink_size is 2", "sink_size: 1"]),
        ("{taskd: true, dp: 1, tp: 2, pp: 2}", ["= 1 replica", "dp (data_parallel)"]),
    ],
)
def test_check_and_run_refuse_configs_that_cannot_recover(tmp_path: Path, ha: str, names: list[str]) -> None:
    job, marker = marker_job(tmp_path, ha)
    for command in (["check", str(job)], ["run", str(job)]):
        result = run_mlaunch(command, timeout=60)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        for name in names:
            assert name in result.stderr, (name, result.stderr)
    assert not marker.exists()


def test_check_prints_the_replica_groups(tmp_path: Path) -> None:
    job, _ = marker_job(tmp_path, "{ttp: true, dp: 2, tp: 2}")
    result = run_mlaunch(["check", str(job)], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "high availability: 2 replica groups of 2 (dp=2, tp=2, pp=1, optimizer_shard=1): [0, 2] [1, 3]" in (
        result.stdout
    )


# ----------------------------------------------------------------------------------------
# TaskD in the plan
# ----------------------------------------------------------------------------------------


def test_taskd_plan_has_one_manager_on_node_0_and_the_env_everywhere(tmp_path: Path, on_path: Path) -> None:
    plan = plan_of(write_job(tmp_path, "{taskd: true, dp: 4}"))
    found = managers(plan)
    assert len(found) == 1 and found[0][0] == 0
    manager = found[0][1]
    assert manager.required is False and manager.label == TASKD_ROLE
    assert manager.argv[1:3] == ["-m", "launchers.run.taskd_manager"]
    args = manager.argv[3:]
    assert args == ["--job-id", "ha-test", "--node-nums", "2", "--proc-per-node", "2"]
    lib = on_path / "taskd" / "python" / "cython_api" / "libs" / "libtaskd.so"
    for proc in plan.processes:
        assert proc.env["LD_PRELOAD"] == str(lib)
        assert proc.env["HCCL_OP_RETRY_ENABLE"] == "L0:0, L1:1, L2:1"
        assert proc.env["ELASTIC_PROCESS_RECOVER_ENABLE"] == "1" and proc.env["PROCESS_RECOVER"] == "on"
    assert sorted(p.rank for p in workers(plan)) == [0, 1, 2, 3]


def test_taskd_manager_only_on_the_platform_node_0(tmp_path: Path, on_path: Path) -> None:
    job_file = write_job(tmp_path, "{taskd: true, dp: 4}")
    base = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2"}
    node0 = plan_of(job_file, {**base, "PET_NODE_RANK": "0", "RANK": "0", "WORLD_SIZE": "4", "POD_IP": "10.0.0.1"})
    node1 = plan_of(job_file, {**base, "PET_NODE_RANK": "1", "RANK": "1", "WORLD_SIZE": "4"})
    assert [(i, p.env.get("MASTER_ADDR")) for i, p in managers(node0)] == [(0, "10.0.0.1")]
    assert managers(node1) == []
    assert sorted(p.rank for p in workers(node1)) == [2, 3]
    assert all("LD_PRELOAD" in p.env for p in node1.processes)


@needs_ascend
def test_taskd_manager_once_when_modelarts_starts_one_copy_per_device(tmp_path: Path, on_path: Path) -> None:
    """ModelArts runs the start file once per device: only the ASCEND_DEVICE_ID=0 copy on node 0 runs the manager."""
    table = {
        "status": "completed",
        "version": "1.0",
        "server_count": "2",
        "server_list": [
            {
                "server_id": f"10.0.0.{s + 1}",
                "device": [
                    {"device_id": str(d), "device_ip": f"192.168.{s}.{d}", "rank_id": str(s * 2 + d)} for d in range(2)
                ],
            }
            for s in range(2)
        ],
    }
    (tmp_path / "hccl.json").write_text(json.dumps(table))
    job_file = write_job(tmp_path, "{taskd: true, dp: 4}", engine="ascend", extra="ascend: {style: rank_table}\n")
    found = []
    for rank in range(4):
        env = {
            "RANK_TABLE_FILE": str(tmp_path / "hccl.json"),
            "ASCEND_DEVICE_ID": str(rank % 2),
            "RANK_ID": str(rank),
            "MA_CURRENT_HOST_IP": f"10.0.0.{rank // 2 + 1}",
        }
        plan = plan_of(job_file, env)
        assert sorted(p.rank for p in workers(plan)) == [rank]
        found += [(rank, node) for node, _ in managers(plan)]
    assert found == [(0, 0)]


def test_taskd_job_id_comes_from_mindcluster(tmp_path: Path, on_path: Path) -> None:
    job_file = write_job(tmp_path, "{taskd: true, dp: 4}")
    env = {
        "MINDX_TASK_ID": "6f1c0a4e-uid",
        "MASTER_ADDR": "10.96.0.12",
        "MASTER_PORT": "2222",
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "LOCAL_RANK": "0,1",
    }
    (_, manager), *_ = managers(plan_of(job_file, env))
    assert manager.argv[manager.argv.index("--job-id") + 1] == "6f1c0a4e-uid"


def test_libmspti_is_preloaded_first_when_the_cann_toolkit_is_present(tmp_path: Path, on_path: Path) -> None:
    cann = tmp_path / "fake-cann"  # FAKE CANN toolkit: only the file mlaunch looks for
    (cann / "lib64").mkdir(parents=True)
    (cann / "lib64" / "libmspti.so").write_text("")
    plan = plan_of(write_job(tmp_path, "{taskd: true, dp: 4}"), {"ASCEND_TOOLKIT_HOME": str(cann)})
    first, second = plan.processes[0].env["LD_PRELOAD"].split(":")
    assert first == str(cann / "lib64" / "libmspti.so") and second.endswith("libtaskd.so")


def test_inherited_ld_preload_is_kept(tmp_path: Path, on_path: Path) -> None:
    plan = plan_of(write_job(tmp_path, "{taskd: true, dp: 4}"), {"LD_PRELOAD": "/opt/libjemalloc.so"})
    assert plan.processes[0].env["LD_PRELOAD"].endswith("libtaskd.so:/opt/libjemalloc.so")


def test_mindspeed_flags_are_appended_once_to_training_processes(tmp_path: Path, on_path: Path) -> None:
    job_file = write_job(tmp_path, "{taskd: true, mindspeed_flags: true, dp: 4}")
    plan = plan_of(job_file)
    for proc in workers(plan):
        assert proc.argv[-2:] == list(MINDSPEED_FLAGS)
        assert proc.argv.count(MINDSPEED_FLAGS[0]) == 1
    (_, manager), *_ = managers(plan)
    assert MINDSPEED_FLAGS[0] not in manager.argv


def test_taskd_not_installed_is_refused_with_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"taskd package is not installed .*unrelated"):
        plan_of(write_job(tmp_path, "{taskd: true, dp: 4}"))


def test_a_taskd_package_without_libtaskd_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    impostor = tmp_path / "site"  # like PyPI's unrelated 'taskd': right name, no libtaskd.so
    (impostor / "taskd").mkdir(parents=True)
    (impostor / "taskd" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(impostor))
    with pytest.raises(UserError, match="has no python/cython_api/libs/libtaskd.so"):
        plan_of(write_job(tmp_path, "{taskd: true, dp: 4}"))


def test_a_separate_python_interpreter_is_asked_where_taskd_is(tmp_path: Path, fake_taskd: Path) -> None:
    venv_python = tmp_path / "bin" / "python"  # a different path to an interpreter: asked by subprocess
    venv_python.parent.mkdir()
    venv_python.write_text(f'#!/bin/sh\nPYTHONPATH={fake_taskd} exec {sys.executable} "$@"\n')
    venv_python.chmod(0o755)
    job_file = write_job(tmp_path, "{taskd: true, dp: 4}", extra=f"python: {venv_python}\n")
    plan = plan_of(job_file)
    assert plan.processes[0].env["LD_PRELOAD"].startswith(str(fake_taskd / "taskd"))
    (_, manager), *_ = managers(plan)
    assert manager.argv[0] == str(venv_python)


# ----------------------------------------------------------------------------------------
# TaskD for real: mlaunch runs the manager beside the workers and stops it with the job
# ----------------------------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from launchers.elastic import taskd

    assert taskd.start_worker() is True
    record = os.environ["FAKE_TASKD_RECORD"]
    deadline = time.time() + 30
    while time.time() < deadline:  # the manager runs at the same time as the workers
        with open(record) as fh:
            if any(json.loads(line)["call"] == "start_taskd_manager" for line in fh):
                break
        time.sleep(0.05)
    with open("/proc/self/maps") as fh:
        loaded = "libtaskd.so" in fh.read()
    out = {k: os.environ.get(k) for k in ("RANK", "LD_PRELOAD", "HCCL_OP_RETRY_ENABLE", "PROCESS_RECOVER")}
    out.update(loaded=loaded, pid=os.getpid(), argv=sys.argv[1:])
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as fh:
        json.dump(out, fh)
    if sys.argv[1:2] == ["hold"]:
        time.sleep(120)
    """
)


def taskd_run_setup(tmp_path: Path, fake_taskd: Path, mode: str, blocks: bool) -> tuple[Path, dict[str, str]]:
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: taskd-run\nentry: worker.py\nengine: pytorch\nnodes: 2\nprocs_per_node: 2\n"
        f"args: [{mode}]\ncheckpoint: {{grace_period: 5s}}\nhigh_availability: {{taskd: true, dp: 4}}\n"
    )
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(fake_taskd), str(ROOT)]),
        FAKE_TASKD_RECORD=str(tmp_path / "record.jsonl"),
        FAKE_TASKD_MANAGER_BLOCKS="1" if blocks else "0",
        MINDX_TASK_ID="job-uid-42",
        OUT_DIR=str(out),
    )
    return job, env


def records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is not alive
        return fh.read().split(") ", 1)[1][0] != "Z"


def check_manager_records(tmp_path: Path) -> int:
    calls = records(tmp_path)
    inits = [c for c in calls if c["call"] == "init_taskd_manager"]
    starts = [c for c in calls if c["call"] == "start_taskd_manager"]
    assert len(inits) == 1 and len(starts) == 1, calls
    assert inits[0]["config"] == {"job_id": "job-uid-42", "node_nums": 2, "proc_per_node": 2}
    assert inits[0]["pid"] == starts[0]["pid"]
    worker_inits = sorted(c["rank_id"] for c in calls if c["call"] == "init_taskd_worker")
    assert worker_inits == [0, 1, 2, 3]
    assert inits[0]["pid"] not in {c["pid"] for c in calls if c["call"] == "init_taskd_worker"}
    return int(inits[0]["pid"])


@pytest.mark.parametrize("blocks", [False, True], ids=["start-returns", "start-blocks"])
def test_taskd_manager_runs_once_on_node_0_and_stops_with_the_job(
    tmp_path: Path, fake_taskd: Path, blocks: bool
) -> None:
    job, env = taskd_run_setup(tmp_path, fake_taskd, "finish", blocks)
    result = run_mlaunch(["run", str(job)], env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    manager_pid = check_manager_records(tmp_path)
    assert not alive(manager_pid)
    assert "[node 0 taskd-manager] taskd-manager: started for job job-uid-42" in result.stderr
    assert "stopping node 0 taskd-manager" in result.stderr
    assert "node 1 taskd-manager" not in result.stderr
    lib = str(fake_taskd / "taskd" / "python" / "cython_api" / "libs" / "libtaskd.so")
    for rank in range(4):
        seen = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
        assert seen["LD_PRELOAD"] == lib and seen["PROCESS_RECOVER"] == "on"
        assert seen["HCCL_OP_RETRY_ENABLE"] == "L0:0, L1:1, L2:1"
        if shutil.which("cc") or shutil.which("gcc"):
            assert seen["loaded"] is True  # the dynamic loader really preloaded it


def test_sigterm_to_mlaunch_stops_the_manager_and_the_workers(tmp_path: Path, fake_taskd: Path) -> None:
    job, env = taskd_run_setup(tmp_path, fake_taskd, "hold", blocks=True)
    proc = subprocess.Popen(
        [*mlaunch_cmd(), "run", str(job)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(list((tmp_path / "out").glob("rank*.json"))) < 4:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        assert len(list((tmp_path / "out").glob("rank*.json"))) == 4
        manager_pid = check_manager_records(tmp_path)
        worker_pids = [json.loads(p.read_text())["pid"] for p in (tmp_path / "out").glob("rank*.json")]
        assert alive(manager_pid) and all(alive(pid) for pid in worker_pids)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert not alive(manager_pid)
    assert not any(alive(pid) for pid in worker_pids)


def test_manager_failure_stops_the_job(tmp_path: Path, fake_taskd: Path) -> None:
    """A manager that cannot start (here: taskd.api missing its manager) fails the job instead of running unguarded."""
    broken = tmp_path / "broken"
    shutil.copytree(fake_taskd / "taskd", broken / "taskd")
    (broken / "taskd" / "api" / "taskd_manager_api.py").write_text(
        "def init_taskd_manager(config):\n    return False\n\ndef start_taskd_manager():\n    return False\n"
    )
    job, env = taskd_run_setup(tmp_path, fake_taskd, "hold", blocks=False)
    env["PYTHONPATH"] = os.pathsep.join([str(broken), str(ROOT)])
    result = run_mlaunch(["run", str(job)], env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "init_taskd_manager" in result.stderr and "failed" in result.stderr
