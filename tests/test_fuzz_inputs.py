"""Fuzz suite (slow): generated job.yaml files, platform env and rank tables through the real CLI.

The outcome of every case must be exit 0 (valid) or exit 2 with one message naming the
file/key or the variable, and no traceback. Hypothesis is derandomized (the same cases on
every run, so CI is reproducible) and keeps no example database. Most cases run mlaunch's own
entry point in-process (``cli_inprocess.run_cli``: ~20 ms a case); a sample runs through the
real console script in a subprocess with a 20 s limit. Figures are printed at the end of
each test (run with ``-s`` to see them): cases, clean errors, accepts, seconds.

    pytest --slow tests/test_fuzz_inputs.py -s
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_inprocess import CliResult, run_cli
from conftest import clean_env, run_mlaunch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launchers.config.job import Job
from launchers.platform.ranktable import generate_rank_table

pytestmark = pytest.mark.slow

CASES = {"job": 500, "env": 450, "rank_table": 150}  # ≥ 1,000 in-process per run, plus the subprocess sample
ENGINES = ("pytorch", "tensorflow", "ascend", "mpi")
FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def key_paths(model: type[Any] = Job, prefix: str = "") -> list[str]:
    """Every key of job.yaml, dotted (``checkpoint.grace_period``), from the model itself."""
    found = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        found.append(path)
        annotation = info.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            found += key_paths(annotation, f"{path}.")
    return found


KEYS = key_paths()
ODD_RAW = [  # YAML text placed as a value as it is
    "2:3",
    "3:2",
    "0",
    "-1",
    "yes",
    "no",
    "on",
    "off",
    "true",
    "~",
    "",
    ".nan",
    ".inf",
    "-.inf",
    "1e400",
    "0x10",
    "0o17",
    "010",
    "1_000",
    "9" * 30,
    "9" * 5000,
    "1.5",
    "'2'",
    '"\\0"',
    '"a\\nb"',
    '"\\ud800"',
    "!!set {a: null}",
    "!!binary aGk=",
    "!x y",
    "!!timestamp 2001-12-14",
    "2001-12-14",
    "&a [1]",
    "*nope",
    "[1, 2",
    "{a: 1, a: 2}",
    "[" * 70 + "]" * 70,
    "[" * 3000 + "]" * 3000,
    "<<: {a: 1}",
    "'tcp://[:6666'",
    "30s",
    "5m",
    "1h30m",
    "²",
    "٣",
    "1000000000000",
    "65536",
    "65535",
    "70000",
    "[a, b]",
    "{x: 1}",
    "|\n  multi\n  line",
]
ODD_VALUES = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, 1, 2, -1, 65535, 65536, 10**12, 2**63]),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.lists(st.text(max_size=8), max_size=4),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
)
ENV_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
ENV_VALUES = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "0",
            "1",
            "2",
            "4",
            "-1",
            "²",
            "٣",
            "1_0",
            "+1",
            "0x1",
            "65536",
            "99999999999",
            "auto",
            "gpu",
            "2:3",
            "3:2",
            "0:0",
            "h",
            "h1,h2",
            "h1,,h2",
            "tcp://[:6666",
            "[::1]:29500",
            "worker",
            "ps",
            "evaluator",
            "chief",
            "MS_SCHED",
            "MS_WORKER",
            "msrun",
            "x" * 5000,
        ]
    ),
    st.integers(min_value=-5, max_value=100).map(str),
    st.text(ENV_CHARS, max_size=30),
)
ENV_NAMES = [
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_WORLD_SIZE",
    "MINDX_TASK_ID",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_RDZV_ENDPOINT",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "JOB_COMPLETION_INDEX",
    "OMPI_MCA_orte_default_hostfile",
    "HOSTNAME",
    "SKYPILOT_NODE_RANK",
    "SKYPILOT_NODE_IPS",
    "SKYPILOT_NUM_NODES",
    "SKYPILOT_NUM_GPUS_PER_NODE",
    "MA_NUM_HOSTS",
    "MA_NUM_GPUS",
    "VC_TASK_INDEX",
    "VK_TASK_INDEX",
    "MA_TASK_INDEX",
    "VC_WORKER_HOSTS",
    "VC_WORKER_NUM",
    "VC_PS_HOSTS",
    "VC_PS_NUM",
    "MA_VJ_NAME",
    "MA_TASK_NAME",
    "ASCEND_DEVICE_ID",
    "RANK_ID",
    "RANK_SIZE",
    "MS_SCHED_HOST",
    "MS_SCHED_PORT",
    "MS_WORKER_NUM",
    "MS_LOCAL_WORKER",
    "MS_NODE_RANK",
    "MS_ROLE",
    "MA_RUN_METHOD",
    "MLAUNCH_SSH_KEYS",
    "TF_CONFIG",
]
TF_CONFIGS = st.one_of(
    st.sampled_from(
        [
            "{",
            "[]",
            "null",
            "{}",
            '{"cluster": {}}',
            '{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps"}}',
            '{"cluster": {"worker": ["h:1"]}, "task": {"type": "evaluator"}}',
            "[" * 5000,
        ]
    ),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6)),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(
                st.sampled_from(["cluster", "task", "worker", "ps", "chief", "evaluator", "type", "index", "0", "1"]),
                inner,
                max_size=4,
            ),
        ),
        max_leaves=12,
    ).map(json.dumps),
)


class Tally:
    """Outcomes of one fuzz test; fails on a traceback, another exit code, or an unnamed error."""

    def __init__(self, name: str) -> None:
        self.name, self.counts, self.start = name, Counter[str](), time.perf_counter()

    def record(self, result: CliResult, names: list[str]) -> None:
        assert result.traceback is None, result.traceback
        assert result.code in (0, 2), (result.code, result.stderr[-2000:])
        if result.code == 2:
            assert "Traceback" not in result.stderr
            assert any(name in result.stderr for name in names), (names, result.stderr[-2000:])
            self.counts["clean errors"] += 1
        else:
            self.counts["accepts"] += 1
        self.counts["cases"] += 1

    def report(self, minimum: int) -> None:
        seconds = time.perf_counter() - self.start
        print(f"\nfuzz {self.name}: {dict(self.counts)} in {seconds:.1f}s")
        assert self.counts["cases"] >= minimum


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return
    node[last] = value


def render(path: str, value: Any, raw: str | None) -> str:
    """job.yaml text: a valid base with one key set (as a Python value dumped, or raw YAML text)."""
    data: dict[str, Any] = {"entry": "t.py"}
    if raw is None:
        set_path(data, path, value)
        return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    *parents, last = path.split(".")
    indent = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents))
    return f"entry: t.py\n{indent}{'  ' * len(parents)}{last}: {raw}\n"


JOB_TALLY = Tally("job.yaml")


@settings(FUZZ, max_examples=CASES["job"])
@given(
    path=st.sampled_from(KEYS),
    value=ODD_VALUES,
    raw=st.one_of(st.none(), st.sampled_from(ODD_RAW), st.text(max_size=30)),
    engine=st.sampled_from(ENGINES),
    junk=st.one_of(st.none(), st.binary(max_size=64)),
)
def test_fuzz_job_files(path: str, value: Any, raw: str | None, engine: str, junk: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.yaml"
        (Path(tmp) / "t.py").write_text("pass\n")
        text = render(path, value, raw).encode("utf-8", "surrogatepass")
        job.write_bytes(text + junk if junk is not None else text)
        result = run_cli(["plan", "--engine", engine, str(job)], clean_env())
        JOB_TALLY.record(result, [str(job)])


def test_fuzz_job_files_figures() -> None:
    JOB_TALLY.report(CASES["job"])


ENV_TALLY = Tally("platform env")


@settings(FUZZ, max_examples=CASES["env"])
@given(
    env=st.dictionaries(st.sampled_from(ENV_NAMES), ENV_VALUES, min_size=1, max_size=6),
    tf_config=st.one_of(st.none(), TF_CONFIGS),
    engine=st.sampled_from(ENGINES),
    args=st.lists(
        st.sampled_from(
            [
                "--init_method",
                "tcp://[:6666",
                "tcp://h:1",
                "--rank",
                "--world_size",
                "0",
                "2",
                "²",
                "--ps_hosts",
                "--worker_hosts",
                "h:1,h:2",
                "--task_index",
                "--job_name",
                "worker",
                "evaluator",
            ]
        ),
        max_size=6,
    ),
)
def test_fuzz_platform_env(env: dict[str, str], tf_config: str | None, engine: str, args: list[str]) -> None:
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.yaml"
        job.write_text("entry: t.py\nascend: {wait_timeout: 0}\n")
        (Path(tmp) / "t.py").write_text("pass\n")
        result = run_cli(["plan", "--engine", engine, str(job), *args], clean_env(**env))
        ENV_TALLY.record(result, [*env, *(a.lstrip("-") for a in args if a.startswith("--")), "platform", str(job)])


def test_fuzz_platform_env_figures() -> None:
    ENV_TALLY.report(CASES["env"])


TABLE_TALLY = Tally("rank tables")
TABLE_VALUES = st.one_of(
    st.sampled_from(["0", "²", "٣", "-1", "", "x", 10**30, -1, None, True, 1.5, [], {}, "completed", "initializing"]),
    st.integers(min_value=-3, max_value=20),
    st.text(max_size=8),
)


@settings(FUZZ, max_examples=CASES["rank_table"])
@given(
    servers=st.integers(min_value=1, max_value=3),
    devices=st.integers(min_value=1, max_value=4),
    mutations=st.lists(
        st.tuples(
            st.sampled_from(["top", "server", "device"]),
            st.sampled_from(
                [
                    "status",
                    "version",
                    "server_count",
                    "server_list",
                    "server_id",
                    "device",
                    "device_id",
                    "rank_id",
                    "device_ip",
                    "super_device_id",
                    "host_ip",
                    "super_pod_list",
                    "group_list",
                ]
            ),
            TABLE_VALUES,
        ),
        max_size=3,
    ),
    truncate=st.one_of(st.none(), st.integers(min_value=0, max_value=200)),
)
def test_fuzz_rank_tables(
    servers: int, devices: int, mutations: list[tuple[str, str, Any]], truncate: int | None
) -> None:
    table: dict[str, Any] = generate_rank_table(servers, devices)
    target = {"top": table, "server": table["server_list"][0], "device": table["server_list"][0]["device"][0]}
    for where, key, value in mutations:  # targets taken first: a mutation may replace server_list itself
        target[where][key] = value
    text = json.dumps(table, ensure_ascii=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hccl.json"
        path.write_text(text[:truncate] if truncate is not None else text, encoding="utf-8")
        job = Path(tmp) / "job.yaml"
        job.write_text("entry: t.py\nascend: {wait_timeout: 0}\n")
        env = clean_env(RANK_TABLE_FILE=str(path))
        result = run_cli(["plan", "--engine", "ascend", str(job)], env)
        TABLE_TALLY.record(result, [str(path), "RANK_TABLE_FILE", "rank table"])


def test_fuzz_rank_tables_figures() -> None:
    TABLE_TALLY.report(CASES["rank_table"])


SUBPROCESS_SAMPLE = [
    ("entry: t.py\nnodes: " + "9" * 5000 + "\n", {}, "pytorch"),
    ("entry: t.py\nargs: " + "[" * 3000 + "]" * 3000 + "\n", {}, "pytorch"),
    ("entry: t.py\nnodes: true\n", {}, "pytorch"),
    ("entry: t.py\npytorch: {nnodes: 3:2}\n", {}, "pytorch"),
    ("entry: t.py\ncheckpoint: {grace_period: .nan}\n", {}, "pytorch"),
    ("entry: t.py\nnodes: 2\nnodes: 3\n", {}, "pytorch"),
    ("entry: t.py\nargs: !!set {a: null}\n", {}, "pytorch"),
    ('entry: t.py\nargs: ["a\\0b"]\n', {}, "pytorch"),
    ('entry: t.py\nname: "\\udcff"\n', {}, "pytorch"),
    ("entry: t.py\nnodes: 30000\n", {}, "tensorflow"),
    ("entry: t.py\n", {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "²"}, "pytorch"),
    ("entry: t.py\n", {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "0"}, "pytorch"),
    ("entry: t.py\n", {"MASTER_ADDR": "h", "RANK": "", "WORLD_SIZE": "2"}, "pytorch"),
    ("entry: t.py\n", {"TF_CONFIG": "{oops"}, "tensorflow"),
    ("entry: t.py\n", {"TF_CONFIG": '{"cluster": {"ps": ["p:1"]}, "task": {"type": "ps"}}'}, "tensorflow"),
    (
        "entry: t.py\n",
        {"TF_CONFIG": '{"cluster": {"worker": ["h:1"], "evaluator": ["e:1"]}, "task": {"type": "evaluator"}}'},
        "tensorflow",
    ),
    ("entry: t.py\n", {"MLAUNCH_SSH_KEYS": "/" + "k" * 5000, "VC_WORKER_HOSTS": "a,b", "VC_TASK_INDEX": "0"}, "mpi"),
    ("entry: t.py\npython: /nonexistent/python\n", {}, "pytorch"),
    ("entry: t.py\ncode_dir: nowhere\n", {}, "pytorch"),
    ("entry: t.py\n", {}, "pytorch"),
]


@pytest.mark.parametrize("command", [["plan"], ["check"], []], ids=["plan", "check", "run"])
def test_fuzz_sample_through_the_real_cli(command: list[str], tmp_path: Path) -> None:
    """The reproducers through the console script itself: exit 0/2, no traceback, within 20 s each."""
    counts: Counter[str] = Counter()
    start = time.perf_counter()
    (tmp_path / "t.py").write_text("pass\n")
    for index, (text, env, engine) in enumerate(SUBPROCESS_SAMPLE):
        job = tmp_path / f"job{index}.yaml"
        job.write_text(text, encoding="utf-8", errors="surrogatepass")
        result = run_mlaunch([*command, "--engine", engine, str(job)], env=clean_env(**env), timeout=20)
        assert result.returncode in (0, 2), (text[:200], env, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, result.stderr
        counts["clean errors" if result.returncode else "accepts"] += 1
    print(f"\nfuzz subprocess {command or ['run']}: {dict(counts)} in {time.perf_counter() - start:.1f}s")
