"""Kubeflow Trainer v2 MPI runtimes: the launcher pod's hostfile (``/etc/mpi/hostfile``) planned by mlaunch.

Trainer cannot run here; the hostfile is written as its mpi plugin (v2.3.0 ``mpi.go``,
``buildHostFileConfigMap``) writes it — ``<pod host>.<trainjob> slots=<numProcPerNode>`` per
node pod — to a temporary path that ``OMPI_MCA_orte_default_hostfile`` names, as Trainer's env
does on the launcher. The plans come from the real ``mlaunch plan --json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_mlaunch

HOSTS = ["demo-node-0-0.demo", "demo-node-0-1.demo", "demo-launcher-0-0.demo"]


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    from bootstrap.keys import generate

    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("name: demo\nentry: train.py\nengine: mpi\nnodes: 3\nprocs_per_node: 1\n")
    (tmp_path / "hostfile").write_text("".join(f"{h} slots=2\n" for h in HOSTS))
    generate(tmp_path / "keys")  # mlaunch's own job secret (`mlaunch keys`), mounted beside Trainer's
    return tmp_path


def launcher_env(job_dir: Path, hostname: str, **extra: str) -> dict[str, str]:
    return clean_env(
        OMPI_MCA_orte_default_hostfile=str(job_dir / "hostfile"),
        OMPI_MCA_orte_set_default_slots="2",
        JOB_COMPLETION_INDEX="0",
        HOSTNAME=hostname,
        MLAUNCH_SSH_KEYS=str(job_dir / "keys"),
        **extra,
    )


def plan(job_dir: Path, env: dict[str, str], *args: str) -> Any:
    result = run_mlaunch(["plan", "--json", *args, str(job_dir / "job.yaml")], env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("hostname", "index", "role"), [("demo-node-0-0", 0, "mpirun"), ("demo-launcher-0-0", 2, "peer")]
)
def test_hosts_slots_and_this_node_come_from_the_hostfile(job_dir: Path, hostname: str, index: int, role: str) -> None:
    data = plan(job_dir, launcher_env(job_dir, hostname))
    assert data["source"] == "kubeflow-trainer-mpi"
    assert data["world_size"] == 6 and data["master_addr"] == HOSTS[0]  # 3 hosts × slots=2
    (node,) = data["nodes"]
    assert (node["index"], node["host"]) == (index, HOSTS[index])
    assert [p["role"] for p in node["processes"]] == [role]
    if role == "mpirun":
        (mpirun,) = node["processes"]
        assert mpirun["argv"][mpirun["argv"].index("-np") + 1] == "6"
        (hostfile,) = [s["params"] for s in node["bootstrap"] if s["name"] == "hostfile"]
        assert hostfile["hosts"] == HOSTS and hostfile["slots"] == 2


def test_the_pytorch_engine_reads_it_too(job_dir: Path) -> None:
    data = plan(job_dir, launcher_env(job_dir, "demo-node-0-1"), "--engine", "pytorch")
    assert data["source"] == "kubeflow-trainer-mpi" and data["master_addr"] == HOSTS[0]
    assert [p["rank"] for n in data["nodes"] for p in n["processes"]] == [2, 3]


def test_an_mpijob_launcher_is_not_taken_for_trainer(job_dir: Path) -> None:
    """The MPI Operator sets the same variable on a non-indexed launcher: no JOB_COMPLETION_INDEX, no Trainer."""
    env = launcher_env(job_dir, "demo-node-0-0")
    del env["JOB_COMPLETION_INDEX"]
    result = run_mlaunch(["plan", "--json", str(job_dir / "job.yaml")], env=env, timeout=60)
    assert result.returncode == 0 and json.loads(result.stdout)["source"] == "local-simulation"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "names a hostfile that cannot be read"),
        ("", "must list 1..65536 distinct hosts; it lists 0"),
        ("a.demo slots=2\nb.demo slots=3\n", "different slots per host ([2, 3])"),
        ("a.demo slots=two\n", "line 1 slots='two' is not an integer"),
        ("a.demo slots=2\na.demo slots=2\n", "distinct hosts"),
        ("a.demo slots=2 max_slots=4 x\n", "line 1 'a.demo slots=2 max_slots=4 x': expected '<host> slots=<n>'"),
    ],
)
def test_a_bad_hostfile_is_a_clear_error(job_dir: Path, text: str | None, message: str) -> None:
    hostfile = job_dir / "hostfile"
    hostfile.unlink()
    if text is not None:
        hostfile.write_text(text)
    result = run_mlaunch(["plan", str(job_dir / "job.yaml")], env=launcher_env(job_dir, "a"), timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_hostname_names_what_is_missing(job_dir: Path) -> None:
    result = run_mlaunch(["plan", str(job_dir / "job.yaml")], env=launcher_env(job_dir, "elsewhere"), timeout=60)
    assert result.returncode == 2 and "not which one this is" in result.stderr, result.stderr
