"""Issue 15's minimal reproducers: every bad input is exit 2 with the key/variable named, never a traceback.

Each case runs mlaunch's real entry point in-process (``cli_inprocess.run_cli``); the fuzz suite
(``test_fuzz_inputs.py``, slow) generates many more around them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_inprocess import run_cli
from conftest import clean_env, run_mlaunch

from launchers.config.job import load_job
from launchers.errors import JobFileError, PlatformError
from launchers.platform.numbers import env_int, parse_int, parse_json


def job_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "t.py").write_text("pass\n")
    return path


def plan(tmp_path: Path, text: str, env: dict[str, str] | None = None, engine: str = "pytorch", extra=()):  # type: ignore[no-untyped-def]
    result = run_cli(["plan", "--engine", engine, str(job_file(tmp_path, text)), *extra], clean_env(**(env or {})))
    assert result.traceback is None, result.traceback
    return result


BAD_JOBS = [
    ("nodes: " + "9" * 5000 + "\n", ["line 2", "number of 5000 characters"]),
    ("args: " + "[" * 2000 + "]" * 2000 + "\n", ["line 2", "nested more than 64"]),
    ("nodes: true\n", ["'nodes'", "valid integer", "True"]),
    ("nodes: '2'\n", ["'nodes'", "valid integer"]),
    ("nodes: 2:3\n", ["'nodes'", "'2:3'"]),
    ("nodes: 1000000000000\n", ["'nodes'", "less than or equal to 65536"]),
    ("nodes: 2000\nprocs_per_node: 1000\n", ["'procs_per_node'", "at most 1048576 ranks"]),
    ("checkpoint: {grace_period: .nan}\n", ["checkpoint.grace_period", "finite"]),
    ("checkpoint: {grace_period: .inf}\n", ["checkpoint.grace_period", "finite"]),
    ("restart: {backoff: -1}\n", ["restart.backoff", "negative"]),
    ("pytorch: {nnodes: '3:2'}\n", ["pytorch.nnodes", "MIN ≤ MAX"]),
    ("pytorch: {nnodes: 0}\n", ["pytorch.nnodes", "MIN ≤ MAX"]),
    ("nodes: 2\nnodes: 3\n", ["line 3", "'nodes' is given twice (lines 2 and 3)"]),
    ("args: !!set {a: null}\n", ["line 2", "tag:yaml.org,2002:set", "not allowed"]),
    ("args: !custom x\n", ["line 2", "'!custom'"]),
    ('name: "\\ud800"\n', ["line 2"]),
    ('args: ["a\\0b"]\n', ["'args[0]'", "NUL"]),
    ('python: "py\\nthon"\n', ["'python'", "newline"]),
    ('python: "/usr/bin/py\\0"\n', ["'python'", "NUL"]),
    ("high_availability: {ttp: yes}\n", ["high_availability.ttp", "valid boolean", "'yes'"]),
    ("tensorflow: {port: 70000}\n", ["tensorflow.port", "65535"]),
    ("code_dir: " + "x" * 300 + "\n", ["'code_dir'", "255 bytes"]),
    (
        "a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n",
        ["more than 50,000 values"],
    ),
]


@pytest.mark.parametrize(("body", "expected"), BAD_JOBS, ids=[f"job{i}" for i in range(len(BAD_JOBS))])
def test_bad_job_files_exit_2_naming_line_and_key(tmp_path: Path, body: str, expected: list[str]) -> None:
    result = plan(tmp_path, "entry: t.py\n" + body)
    assert result.code == 2, result
    for fragment in expected:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("body", "check"),
    [
        ("pytorch: {nnodes: 2:3}\n", lambda job: job.pytorch.nnodes == "2:3"),  # YAML 1.2: a string, not 123
        ("args: [yes, no, on, off, 010, 0x10]\n", lambda job: job.args == ["yes", "no", "on", "off", "10", "16"]),
        ("env: {A: 2024-01-01}\n", lambda job: job.env == {"A": "2024-01-01"}),
        ("checkpoint: {grace_period: 0}\n", lambda job: job.checkpoint.grace_period == 0),
    ],
)
def test_yaml_12_values(tmp_path: Path, body: str, check) -> None:  # type: ignore[no-untyped-def]
    assert check(load_job(job_file(tmp_path, "entry: t.py\n" + body)))


# Time goals (a 1 MB job plans in < 2 s, refusals at once) are in benchmarks/input_bounds.py, measured
# against an empty job in the same run; here only the behaviour and the fuzz suite's hang bound.
HANG_BOUND = 20.0


def test_a_one_megabyte_job_plans(tmp_path: Path) -> None:
    line = "  - --option-with-a-long-name=" + "v" * 200 + "\n"
    body = "args:\n" + line * ((1024 * 1024 - 200) // len(line))
    start = time.perf_counter()
    result = plan(tmp_path, "entry: t.py\n" + body, engine="pytorch")
    assert result.code == 0, result.stderr
    assert time.perf_counter() - start < HANG_BOUND


def test_a_one_megabyte_list_of_tiny_values_is_refused_early(tmp_path: Path) -> None:
    start = time.perf_counter()
    result = plan(tmp_path, "entry: t.py\nargs:\n" + "  - x\n" * 170_000)
    assert result.code == 2 and "more than 50,000 values" in result.stderr, result.stderr
    assert time.perf_counter() - start < HANG_BOUND


def test_a_job_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    result = plan(tmp_path, "entry: t.py\n#" + "x" * (1024 * 1024) + "\n")
    assert result.code == 2 and "larger than 1,048,576 bytes" in result.stderr


PLATFORM_CASES = [
    ({"PET_NNODES": "1", "PET_NPROC_PER_NODE": "²"}, "PET_NPROC_PER_NODE"),
    ({"PET_NNODES": "1", "PET_NPROC_PER_NODE": "٣"}, "PET_NPROC_PER_NODE"),
    ({"PET_NNODES": "1", "PET_NPROC_PER_NODE": "0"}, "PET_NPROC_PER_NODE"),
    ({"MASTER_ADDR": "h", "RANK": "", "WORLD_SIZE": "2"}, "RANK is set but empty"),
    ({"MASTER_ADDR": "h", "RANK": "0", "WORLD_SIZE": ""}, "WORLD_SIZE is set but empty"),
    ({"MA_NUM_HOSTS": "1000000", "VC_TASK_INDEX": "0", "MA_VJ_NAME": "j"}, "MA_NUM_HOSTS"),
    ({"PET_NNODES": "65536", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "17", "MASTER_ADDR": "h"}, "at most"),
    ({"MASTER_ADDR": "h", "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "99999"}, "MASTER_PORT"),
]


@pytest.mark.parametrize(("env", "named"), PLATFORM_CASES)
def test_platform_env_errors_name_the_variable(tmp_path: Path, env: dict[str, str], named: str) -> None:
    result = plan(tmp_path, "entry: t.py\n", env)
    assert result.code == 2 and named in result.stderr, result.stderr


def test_init_method_with_a_broken_ipv6_address(tmp_path: Path) -> None:
    result = plan(
        tmp_path, "entry: t.py\n", extra=["--init_method", "tcp://[:6666", "--rank", "0", "--world_size", "1"]
    )
    assert result.code == 2 and "--init_method" in result.stderr


@pytest.mark.parametrize(
    ("tf_config", "expected"),
    [
        ("{oops", "TF_CONFIG is not valid JSON (line 1, column 2"),
        ("[" * 100000, "TF_CONFIG nests more than 64"),
        ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": ' + "9" * 5000 + "}}", "TF_CONFIG"),
        ('{"cluster": 3}', "'cluster' must be"),
        ('{"cluster": {"worker": ["h:1"], "evaluator": ["e:1"]}, "task": {"type": "evaluator"}}', "evaluator"),
        ('{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}', "no worker or chief"),
        ('{"cluster": {"worker": {"²": "h:1"}}, "task": {"type": "worker"}}', "cluster.worker index"),
    ],
)
def test_tf_config_errors(tmp_path: Path, tf_config: str, expected: str) -> None:
    result = plan(tmp_path, "entry: t.py\n", {"TF_CONFIG": tf_config}, engine="tensorflow")
    assert result.code == 2 and expected in result.stderr, result.stderr


@pytest.mark.parametrize("engine", ["pytorch", "ascend", "tensorflow", "mpi"])
def test_planning_a_huge_simulation_is_refused_at_once(tmp_path: Path, engine: str) -> None:
    start = time.perf_counter()
    result = plan(tmp_path, "entry: t.py\nnodes: 64\nprocs_per_node: 1024\n", engine=engine)
    if engine != "mpi":  # one mpirun for every rank: nothing per rank is planned
        assert result.code == 2 and "a simulation runs at most 4096" in result.stderr, result.stderr
    assert time.perf_counter() - start < HANG_BOUND


def test_tensorflow_free_port_search_is_bounded(tmp_path: Path) -> None:
    start = time.perf_counter()
    result = plan(tmp_path, "entry: t.py\nnodes: 4\nprocs_per_node: 1000\ntensorflow: {ps: 64}\n", engine="tensorflow")
    assert result.code == 2 and "4256 tasks needs as many free ports" in result.stderr, result.stderr
    result = plan(tmp_path, "entry: t.py\nnodes: 30000\n", engine="tensorflow")
    assert result.code == 2 and "a simulation runs at most 4096" in result.stderr, result.stderr
    assert time.perf_counter() - start < HANG_BOUND


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ({"device_id": "٣", "device_ip": "1.1.1.1", "rank_id": "0"}, "device_id"),
        ({"device_id": "0", "device_ip": "1.1.1.1", "rank_id": "²"}, "rank_id"),
        ({"device_id": "0", "device_ip": "1.1.1.1", "rank_id": 10**30}, "rank_id"),
    ],
)
def test_rank_table_unicode_digits(tmp_path: Path, device: dict[str, object], expected: str) -> None:
    table = {"version": "1.0", "status": "completed", "server_list": [{"server_id": "s", "device": [device]}]}
    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(table, ensure_ascii=False))
    result = plan(tmp_path, "entry: t.py\n", {"RANK_TABLE_FILE": str(path)}, engine="ascend")
    assert result.code == 2 and expected in result.stderr, result.stderr


@pytest.mark.parametrize("text", ["{", "[" * 100000, '{"status": ' + "1" * 5000 + "}", "[]"])
def test_rank_table_json_errors(tmp_path: Path, text: str) -> None:
    path = tmp_path / "hccl.json"
    path.write_text(text)
    result = plan(tmp_path, "entry: t.py\n", {"RANK_TABLE_FILE": str(path)}, engine="ascend")
    assert result.code == 2 and "hccl.json" in result.stderr, result.stderr


def test_ascend_device_id_unicode(tmp_path: Path) -> None:
    from launchers.platform.ranktable import generate_rank_table

    path = tmp_path / "hccl.json"
    path.write_text(json.dumps(generate_rank_table(1, 2)))
    env = {"RANK_TABLE_FILE": str(path), "ASCEND_DEVICE_ID": "²", "RANK_ID": "0"}
    result = plan(tmp_path, "entry: t.py\n", env, engine="ascend")
    assert result.code == 2 and "ASCEND_DEVICE_ID" in result.stderr, result.stderr


def test_long_ssh_keys_path(tmp_path: Path) -> None:
    env = {"MLAUNCH_SSH_KEYS": "/" + "k" * 5000, "MA_NUM_HOSTS": "2", "VC_TASK_INDEX": "0", "VC_WORKER_HOSTS": "a,b"}
    result = plan(tmp_path, "entry: t.py\n", env, engine="mpi")
    assert result.code in (0, 2) and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("raw", "ok"),
    [("7", 7), (" 12 ", 12), ("²", None), ("٣", None), ("1_0", None), ("+1", None), ("-1", None), ("", None)],
)
def test_the_one_integer_parser(raw: str, ok: int | None) -> None:
    if ok is None:
        with pytest.raises(PlatformError, match="platform env X"):
            parse_int(raw, "platform env X")
    else:
        assert parse_int(raw, "platform env X") == ok


def test_env_int_empty_and_unset() -> None:
    assert env_int({}, "RANK") is None
    assert env_int({"RANK": ""}, "RANK", empty_is_unset=True) is None
    with pytest.raises(PlatformError, match="RANK is set but empty"):
        env_int({"RANK": " "}, "RANK")
    with pytest.raises(PlatformError, match="must be ≤ 10"):
        env_int({"N": "11"}, "N", maximum=10)


def test_parse_json_position() -> None:
    with pytest.raises(PlatformError, match=r"line 2, column 1"):
        parse_json('{"a": 1,\n}', "X")


# -- check covers the run path; the run path runs the same checks first --------------------------
RUN_PATH = [
    ("entry: t.py\npython: /nonexistent/python3\n", "python: '/nonexistent/python3'"),
    ("entry: t.py\npython: no-such-python-xyz\n", "not found on PATH"),
    ("entry: t.py\npython: ./t.py\n", "not an executable file"),
    ("entry: t.py\ncode_dir: missing\n", "code_dir: 'missing'"),
    ("entry: gone.py\n", "gone.py does not exist"),
    ("entry: t.py\nlog_dir: t.py/logs\n", "log_dir"),
    ("entry: t.py\ncheckpoint: {dir: t.py}\n", "checkpoint.dir"),
    ('entry: t.py\ncode_dir: "a\\nb"\n', "newline"),
]


@pytest.mark.parametrize(("text", "expected"), RUN_PATH)
def test_check_reports_what_the_run_would_trip_on(tmp_path: Path, text: str, expected: str) -> None:
    path = job_file(tmp_path, text)
    result = run_cli(["check", "--engine", "pytorch", str(path)], clean_env())
    assert result.traceback is None and result.code == 2, result
    assert expected in result.stderr


@pytest.mark.parametrize(("text", "expected"), RUN_PATH[:4])
def test_the_run_path_refuses_before_launching(tmp_path: Path, text: str, expected: str) -> None:
    path = job_file(tmp_path, text)
    result = run_mlaunch(["--engine", "pytorch", str(path)], env=clean_env(), timeout=60)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "nothing was launched" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "output").exists()


def test_load_job_error_type(tmp_path: Path) -> None:
    with pytest.raises(JobFileError):
        load_job(job_file(tmp_path, "entry: t.py\nnodes: 1\nnodes: 1\n"))


@pytest.mark.parametrize("engine", ["tensorflow", "pytorch"])
def test_a_platform_flag_followed_by_another_flag_has_no_value(tmp_path: Path, engine: str) -> None:
    """``--worker_hosts --init_method`` once planned a worker on host '--init_method' (found by the fuzz suite)."""
    job = tmp_path / "job.yaml"
    job.write_text("entry: t.py\n")
    flag = "--worker_hosts" if engine == "tensorflow" else "--rank"
    result = run_cli(["plan", "--engine", engine, str(job), flag, "--init_method"], clean_env(RANK=""))
    assert result.code == 2 and result.traceback is None, result
    assert f"platform argument {flag} has no value (it is followed by '--init_method')" in result.stderr
