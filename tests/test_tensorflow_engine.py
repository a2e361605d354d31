"""TensorFlow engine: plans from every platform input, and real processes for the ps-as-service rule.

The plans use hand-written ModelArts flags, TF_CONFIG (Kubeflow) and Volcano env. The runs use a
plain-Python start file that behaves like TF servers (a ps, or a worker under
ParameterServerStrategy, serves until killed; workers/chief exit when done): the real TensorFlow
jobs are in test_tensorflow_real.py (slow suite).
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest
from conftest import clean_env, run_mlaunch

from launchers.config.job import load_job
from launchers.errors import PlatformError, UserError
from launchers.plan import LaunchPlan
from launchers.run.runner import make_plan


def write_job(tmp_path: Path, text: str = "", entry: str = "train.py") -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"name: tfjob\nengine: tensorflow\nentry: {entry}\n{text}")
    return job


def plan_for(tmp_path: Path, env: dict[str, str], text: str = "", args: list[str] | None = None) -> LaunchPlan:
    job = load_job(write_job(tmp_path, text))
    return make_plan(job, "tensorflow", args or [], env)[2]


def tf_config(proc) -> dict:
    return json.loads(proc.env["TF_CONFIG"])


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# -- simulated / node-level layouts ---------------------------------------------------------


def test_simulated_ps_beside_each_worker(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, {}, "nodes: 2\nprocs_per_node: 1\ntensorflow: {ps: 1}\n")
    assert plan.simulated and plan.world_size == 2
    roles = [[(p.role, p.rank, p.required) for p in n.processes] for n in plan.nodes]
    assert roles == [[("ps", 0, False), ("worker", 0, True)], [("ps", 1, False), ("worker", 1, True)]]
    config = tf_config(plan.processes[0])
    assert set(config["cluster"]) == {"worker", "ps"} and config["task"] == {"type": "ps", "index": 0}
    addresses = config["cluster"]["worker"] + config["cluster"]["ps"]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
    ps = plan.processes[0]
    assert ps.env["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_VISIBLE_DEVICES" not in plan.processes[1].env
    worker = plan.processes[3]
    assert flag(worker.argv, "--job_name") == "worker" and flag(worker.argv, "--task_index") == "1"
    assert flag(worker.argv, "--ps_hosts") == ",".join(config["cluster"]["ps"])
    assert flag(worker.argv, "--worker_hosts") == ",".join(config["cluster"]["worker"])


def test_chief_decides_and_workers_become_services(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, {}, "procs_per_node: 3\ntensorflow: {ps: 1, chief: true, output: tf_config}\n")
    got = [(p.role, p.rank, p.required) for p in plan.processes]
    assert got == [("ps", 0, False), ("chief", 0, True), ("worker", 0, False), ("worker", 1, False)]
    config = tf_config(plan.processes[1])
    assert len(config["cluster"]["chief"]) == 1 and len(config["cluster"]["worker"]) == 2
    assert all("--job_name" not in p.argv for p in plan.processes)  # output: tf_config only
    both = plan_for(tmp_path, {}, "procs_per_node: 3\ntensorflow: {ps: 1, chief: true, decides: workers}\n")
    assert [p.required for p in both.processes] == [False, True, True, True]


def test_mwms_without_ps_has_no_ps_key(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, {}, "nodes: 2\ntensorflow: {ps: 0, output: flags}\n")
    assert all(p.role == "worker" and p.required for p in plan.processes)
    assert "TF_CONFIG" not in plan.processes[0].env and "--ps_hosts" not in plan.processes[0].argv


def test_modelarts_nodes_only_lays_out_ports_on_hosts(tmp_path: Path) -> None:
    env = {"MA_NUM_HOSTS": "2", "VC_TASK_INDEX": "1", "VC_WORKER_HOSTS": "job-worker-0.job,job-worker-1.job"}
    plan = plan_for(tmp_path, env, "procs_per_node: 2\ntensorflow: {ps: 1, port: 5000}\n")
    assert [n.index for n in plan.nodes] == [1]
    config = tf_config(plan.processes[0])
    assert config["cluster"]["worker"] == [
        "job-worker-0.job:5000",
        "job-worker-0.job:5001",
        "job-worker-1.job:5000",
        "job-worker-1.job:5001",
    ]
    assert config["cluster"]["ps"] == ["job-worker-0.job:5002", "job-worker-1.job:5002"]
    assert [(p.role, p.rank) for p in plan.processes] == [("ps", 1), ("worker", 2), ("worker", 3)]


# -- the platform names every task ----------------------------------------------------------


MA_ARGS = ["--ps_hosts", "[a-ps-0.a:5001,a-ps-1.a:5002]", "--worker_hosts", "a-w-0.a:6001,a-w-1.a:6002"]


def test_modelarts_flags_one_task_per_container(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, {}, args=["--data_url", "obs://d", *MA_ARGS, "--task_index", "1", "--job_name", "ps"])
    (proc,) = plan.processes
    assert (proc.role, proc.rank, proc.required) == ("ps", 1, False) and proc.env["CUDA_VISIBLE_DEVICES"] == ""
    assert proc.argv[proc.argv.index("--data_url") + 1] == "obs://d"  # not consumed: the script's own
    assert flag(proc.argv, "--ps_hosts") == "a-ps-0.a:5001,a-ps-1.a:5002"
    assert tf_config(proc)["task"] == {"type": "ps", "index": 1}
    assert plan.source == "modelarts-tf-flags" and plan.simulated is False


def test_task_name_is_passed_on_as_task_name(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, {}, args=[*MA_ARGS, "--task_index=0", "--task_name=worker"])
    (proc,) = plan.processes
    assert flag(proc.argv, "--task_name") == "worker" and "--job_name" not in proc.argv
    forced = plan_for(
        tmp_path, {}, "tensorflow: {role_flag: job_name}\n", args=[*MA_ARGS, "--task_name=worker", "--task_index=1"]
    )
    assert flag(forced.processes[0].argv, "--job_name") == "worker"


def test_kubeflow_tf_config_keeps_its_extras(tmp_path: Path) -> None:
    config = {
        "cluster": {
            "ps": ["j-ps-0.ns.svc:2222"],
            "worker": {"0": "j-worker-0.ns.svc:2222", "1": "j-worker-1.ns.svc:2222"},
        },
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    plan = plan_for(tmp_path, {"TF_CONFIG": json.dumps(config)})
    (proc,) = plan.processes
    out = tf_config(proc)
    assert out["environment"] == "cloud" and out["task"] == {"type": "worker", "index": 1}
    assert out["cluster"]["worker"] == ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"]
    assert proc.required and flag(proc.argv, "--job_name") == "worker"


def test_volcano_env_role_from_ma_task_name(tmp_path: Path) -> None:
    env = {
        "VC_PS_HOSTS": "j-ps-0.j",
        "VC_PS_NUM": "1",
        "VC_WORKER_HOSTS": "j-worker-0.j,j-worker-1.j",
        "VC_WORKER_NUM": "2",
        "VC_TASK_INDEX": "1",
        "MA_TASK_NAME": "worker",
    }
    plan = plan_for(tmp_path, env, "tensorflow: {port: 2223}\n")
    (proc,) = plan.processes
    assert tf_config(proc)["cluster"] == {"ps": ["j-ps-0.j:2223"], "worker": ["j-worker-0.j:2223", "j-worker-1.j:2223"]}
    assert tf_config(proc)["task"] == {"type": "worker", "index": 1}


def test_flags_and_volcano_env_agree_on_hosts_without_ports(tmp_path: Path) -> None:
    env = {"VC_PS_HOSTS": "a-ps-0.a,a-ps-1.a", "VC_WORKER_HOSTS": "a-w-0.a,a-w-1.a", "VC_TASK_INDEX": "0"}
    plan = plan_for(tmp_path, {**env, "MA_TASK_NAME": "worker"}, args=[*MA_ARGS, "--job_name", "worker"])
    (proc,) = plan.processes
    assert tf_config(proc)["cluster"]["ps"] == ["a-ps-0.a:5001", "a-ps-1.a:5002"]  # the flags' ports win
    assert (proc.role, proc.rank) == ("worker", 0)


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        (
            {"VC_TASK_INDEX": "1"},
            [*MA_ARGS, "--job_name", "worker", "--task_index", "0"],
            r"index: .* says 0, .* says 1",
        ),
        ({"MA_TASK_NAME": "ps"}, [*MA_ARGS, "--job_name", "worker"], r"role: modelarts-tf-flags says worker"),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["x:1", "y:2"]}, "task": {"type": "worker", "index": 0}})},
            [*MA_ARGS, "--job_name", "worker", "--task_index", "0"],
            r"disagree on the worker hosts: modelarts-tf-flags says a-w-0\.a:6001,a-w-1\.a:6002, but TF_CONFIG",
        ),
        ({}, [*MA_ARGS, "--job_name", "worker", "--task_name", "ps"], r"--job_name=worker but --task_name=ps"),
        ({}, [*MA_ARGS, "--task_index", "0"], r"not this task's role; expected --job_name"),
        ({}, [*MA_ARGS, "--job_name", "ps", "--task_index", "2"], r"ps 2 \(--task_index=2\) but --ps_hosts lists 2 ps"),
        ({}, ["--ps_hosts", "a:1"], r"without --worker_hosts"),
        ({"TF_CONFIG": "{oops"}, [], r"TF_CONFIG is not valid JSON"),
        ({}, [*MA_ARGS, "--job_name", "boss"], r"--job_name='boss': expected one of chief, worker, ps"),
    ],
)
def test_contradictions_and_bad_input(tmp_path: Path, env: dict[str, str], args: list[str], message: str) -> None:
    with pytest.raises(PlatformError, match=message):
        plan_for(tmp_path, env, args=args)


def test_chief_with_flags_only_is_a_job_file_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"chief: true needs TF_CONFIG"):
        load_job(write_job(tmp_path, "tensorflow: {chief: true, output: flags}\n"))


# -- real processes: services are stopped once the deciding roles succeed --------------------

FAKE_TF = textwrap.dedent(
    """
    import json, os, sys, time
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}{task['index']}"
    with open(os.path.join(sys.argv[1], name + ".pid"), "w") as f:
        f.write(str(os.getpid()))
    if task["type"] in sys.argv[2].split(","):
        deadline = time.time() + 20
        while len(os.listdir(sys.argv[1])) < int(sys.argv[4]) and time.time() < deadline:
            time.sleep(0.05)  # finish only once every task has started (and written its pid)
        time.sleep(0.2)
        print(name, "done", flush=True)
        sys.exit(int(sys.argv[3]) if task["index"] == 1 else 0)
    print(name, "serving", flush=True)
    while True:
        time.sleep(1)  # a TF server's join(): never returns on its own
    """
)


def run_fake(tmp_path: Path, layout: str, finishers: str, code: int = 0, tasks: int = 4) -> tuple[int, str, list[int]]:
    (tmp_path / "fake_tf.py").write_text(FAKE_TF)
    pids = tmp_path / "pids"
    pids.mkdir()
    job = tmp_path / "job.yaml"
    job.write_text(
        f"entry: fake_tf.py\nargs: [{pids}, {finishers}, {code}, {tasks}]\ncheckpoint: {{grace_period: 5s}}\n{layout}"
    )
    t0 = time.monotonic()
    result = run_mlaunch(["--engine", "tensorflow", str(job)], env=clean_env(), timeout=60)
    assert time.monotonic() - t0 < 30, "services were not stopped"
    started = [int(p.read_text()) for p in pids.iterdir()]
    return result.returncode, result.stdout + result.stderr, started


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ps_are_stopped_after_the_workers_and_the_job_exits_0(tmp_path: Path) -> None:
    code, out, pids = run_fake(tmp_path, "nodes: 2\ntensorflow: {ps: 1}\n", "worker")
    assert code == 0, out
    assert "worker0 done" in out and "worker1 done" in out
    assert "stopping ps 0, ps 1" in out.replace("node 0 ps 0", "ps 0").replace("node 1 ps 1", "ps 1")
    assert len(pids) == 4 and not any(alive(p) for p in pids)
    # the closing line does not claim that the stopped ps "exited 0"
    assert "job finished: all 2 required processes exited 0; 2 service process(es) stopped after them" in out


def test_chief_decides_under_parameter_server_strategy(tmp_path: Path) -> None:
    layout = "procs_per_node: 3\ntensorflow: {ps: 1, chief: true, output: tf_config}\n"
    code, out, pids = run_fake(tmp_path, layout, "chief")
    assert code == 0, out
    assert "chief0 done" in out and "worker0 done" not in out
    assert len(pids) == 4 and not any(alive(p) for p in pids)


def test_a_failing_worker_fails_the_job_and_stops_the_ps(tmp_path: Path) -> None:
    code, out, pids = run_fake(tmp_path, "nodes: 2\ntensorflow: {ps: 1}\n", "worker", code=3)
    assert code == 3, out
    assert "exited with code 3" in out
    assert not any(alive(p) for p in pids)


def test_cli_plan_json_with_modelarts_flags(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    result = run_mlaunch(
        ["plan", "--engine", "tensorflow", str(job), "--json", *MA_ARGS, "--job_name", "worker"],
        env=clean_env(VC_TASK_INDEX="1", MA_TASK_NAME="worker"),
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    (node,) = plan["nodes"]
    (proc,) = node["processes"]
    assert (proc["role"], proc["rank"], proc["required"]) == ("worker", 1, True)
    assert json.loads(proc["env"]["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    assert proc["argv"][-4:] == ["--job_name", "worker", "--task_index", "1"]
    assert node["host"] == "a-w-1.a" and plan["source"] == "modelarts-tf-flags"
