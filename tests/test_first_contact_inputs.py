"""Issue 25's last bad inputs: each is exit 2 with one message naming the key, variable, argument or field.

Each case runs mlaunch's real entry point in-process (``cli_inprocess.run_cli``), except the run
path's refusal (the real console script, so "nothing was launched" is what a user sees). The
Slurm case runs Slurm's real ``scontrol`` (installed here, without a configuration: it fails,
as it does on a login node without one); python-hostlist is hidden from the import system so
that mlaunch falls back to it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from cli_inprocess import run_cli
from conftest import clean_env, run_mlaunch


def job_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "t.py").write_text("pass\n")
    return path


def refused(tmp_path: Path, body: str, *, engine: str = "pytorch", env: dict[str, str] | None = None, args=()):  # type: ignore[no-untyped-def]
    """``mlaunch plan`` of ``body``: exit 2, no traceback; its message."""
    result = run_cli(["plan", "--engine", engine, str(job_file(tmp_path, body)), *args], clean_env(**(env or {})))
    assert result.traceback is None, result.traceback
    assert result.code == 2, (result.code, result.stdout[-800:], result.stderr[-800:])
    assert "Traceback" not in result.stderr
    return result.stderr


def test_code_dir_that_does_not_exist_with_an_absolute_entry_is_refused(tmp_path: Path) -> None:
    """It is every process's working directory: the start file existing elsewhere does not help (was exit 127)."""
    body = f"entry: {tmp_path / 't.py'}\ncode_dir: /nonexistent\n"
    checked = run_cli(["check", "--engine", "pytorch", str(job_file(tmp_path, body))], clean_env())
    assert checked.code == 2 and checked.traceback is None, checked
    assert "code_dir: '/nonexistent'" in checked.stderr and "working directory" in checked.stderr
    ran = run_mlaunch(["--engine", "pytorch", str(tmp_path / "job.yaml")], env=clean_env(), timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert "code_dir: '/nonexistent'" in ran.stderr and "nothing was launched" in ran.stderr
    assert not (tmp_path / "output").exists()


@pytest.mark.parametrize(("value", "said"), [("null", "got null"), ("4", "engine tensorflow does not read it")])
def test_mpi_node0_timeout_with_another_engine_is_refused(tmp_path: Path, value: str, said: str) -> None:
    """The MPI engine's older name of monitor.node_timeout: another engine must not silently take (or ignore) it."""
    message = refused(tmp_path, f"entry: t.py\nmpi: {{node0_timeout: {value}}}\n", engine="tensorflow")
    assert "line 2" in message and "'mpi.node0_timeout'" in message, message
    assert "monitor.node_timeout" in message and said in message, message


def test_mpi_node0_timeout_null_is_refused_for_mpi_too(tmp_path: Path) -> None:
    message = refused(tmp_path, "entry: t.py\nmpi: {node0_timeout: null}\n", engine="mpi")
    assert "'mpi.node0_timeout'" in message and "not a duration" in message, message


@pytest.mark.parametrize("value", ["' 2'", "'2 '", "' 2:3'", "'2: 3'"])
def test_pytorch_nnodes_with_spaces_is_refused(tmp_path: Path, value: str) -> None:
    message = refused(tmp_path, f"entry: t.py\npytorch: {{nnodes: {value}}}\n")
    assert "'pytorch.nnodes'" in message and "line 2" in message, message


@pytest.mark.parametrize("tagged", ["!!bool ''", "!!bool 'x'", "!!bool yes", "!!int 'x'", "!!float 'x'", "!!null 'x'"])
def test_an_explicit_core_tag_on_a_value_it_does_not_fit_is_refused(tmp_path: Path, tagged: str) -> None:
    message = refused(tmp_path, f"entry: t.py\ntensorflow: {{chief: {tagged}}}\n", engine="tensorflow")
    assert "line 2" in message and "'tensorflow.chief'" in message, message


def test_explicit_core_tags_on_values_that_fit_still_load(tmp_path: Path) -> None:
    from launchers.config.job import load_job

    job = load_job(job_file(tmp_path, "entry: t.py\ntensorflow: {chief: !!bool 'true', port: !!int '2300'}\n"))
    assert job.tensorflow.chief is True and job.tensorflow.port == 2300


def test_modelarts_tf_flags_index_past_the_worker_hosts_names_the_arguments(tmp_path: Path) -> None:
    args = ["--worker_hosts", "h1:2222", "--task_index", "1", "--job_name", "worker"]
    message = refused(tmp_path, "entry: t.py\n", engine="tensorflow", args=args)
    assert "--task_index=1" in message and "--worker_hosts" in message and "1 worker host " in message, message
    assert "hosts are listed" not in message


def test_the_index_message_names_every_input_that_listed_the_hosts(tmp_path: Path) -> None:
    args = ["--worker_hosts", "h1:2222", "--ps_hosts", "p:2222", "--task_index", "1", "--job_name", "worker"]
    env = {"VC_PS_HOSTS": "p", "VC_WORKER_HOSTS": "h1", "MA_TASK_NAME": "worker"}
    message = refused(tmp_path, "entry: t.py\n", engine="tensorflow", env=env, args=args)
    assert "--worker_hosts" in message and "VC_WORKER_HOSTS" in message and "--task_index=1" in message, message


@pytest.mark.parametrize(("role", "article"), [("evaluator", "an"), ("chief", "a")])
def test_a_role_the_cluster_does_not_list_names_where_both_came_from(tmp_path: Path, role: str, article: str) -> None:
    tf_config = json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": role}})
    message = refused(tmp_path, "entry: t.py\n", engine="tensorflow", env={"TF_CONFIG": tf_config})
    assert f"{article} {role}" in message and "TF_CONFIG task.type" in message, message
    assert f"TF_CONFIG cluster lists no {role} hosts" in message, message


def test_a_five_thousand_digit_rank_id_names_the_field(tmp_path: Path) -> None:
    from launchers.platform.ranktable import generate_rank_table

    table = json.dumps(generate_rank_table(1, 2)).replace('"rank_id": "1"', '"rank_id": ' + "9" * 5000)
    path = tmp_path / "hccl.json"
    path.write_text(table)
    message = refused(tmp_path, "entry: t.py\nprocs_per_node: 2\n", engine="ascend", env={"RANK_TABLE_FILE": str(path)})
    assert "'rank_id'" in message and "5000 digits" in message, message
    assert "set_int_max_str_digits" not in message and len(message) < 600, message


def test_a_five_thousand_character_rank_id_string_is_not_repeated_whole(tmp_path: Path) -> None:
    from launchers.platform.ranktable import generate_rank_table

    table = json.dumps(generate_rank_table(1, 2)).replace('"rank_id": "1"', '"rank_id": "' + "9" * 5000 + '"')
    path = tmp_path / "hccl.json"
    path.write_text(table)
    message = refused(tmp_path, "entry: t.py\nprocs_per_node: 2\n", engine="ascend", env={"RANK_TABLE_FILE": str(path)})
    assert "'rank_id'" in message and "5000 characters" in message and len(message) < 600, message


def test_a_five_thousand_digit_tf_config_index_names_the_field(tmp_path: Path) -> None:
    tf_config = '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": ' + "9" * 5000 + "}}"
    message = refused(tmp_path, "entry: t.py\n", engine="tensorflow", env={"TF_CONFIG": tf_config})
    assert "TF_CONFIG has field 'index'" in message and "5000 digits" in message, message
    assert "set_int_max_str_digits" not in message, message
    assert len(message) < 600, message


def test_a_failing_scontrol_is_quoted_after_the_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("scontrol") is None:
        pytest.skip("needs Slurm's scontrol (installed by .ci/run)")
    from launchers.errors import PlatformError
    from launchers.platform.slurm_env import from_slurm_env

    monkeypatch.setitem(sys.modules, "hostlist", None)  # python-hostlist not installed: mlaunch asks scontrol
    with pytest.raises(PlatformError) as caught:
        from_slurm_env({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node[1-"})
    message = str(caught.value)
    sentence, _, quoted = message.partition("\n")
    assert "SLURM_JOB_NODELIST='node[1-'" in sentence and "python-hostlist" in sentence, message
    assert "scontrol:" not in sentence and sentence.rstrip().endswith(":"), message
    assert quoted.strip(), message  # what scontrol said, after the sentence
