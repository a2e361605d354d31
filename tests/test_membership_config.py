"""An elastic job's inputs and plans (issue 27): the range's exit-2 checks, and the plan of a resized job.

``mlaunch plan`` runs in-process on ModelArts-style platform inputs (env and appended args, as a
node sees them); the resized plans come from the engine's own planning of ``platform.resize``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_inprocess import run_cli
from conftest import clean_env

from launchers.config.job import load_job
from launchers.engines import get_engine
from launchers.errors import UserError
from launchers.planning import plan_attempt
from launchers.platform.resize import resize

HOSTS = "w-0.job,w-1.job,w-2.job"


def job_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"entry: t.py\nprocs_per_node: 2\n{body}", encoding="utf-8")
    (tmp_path / "t.py").write_text("pass\n")
    return path


def platform(index: int, nodes: int = 3) -> dict[str, str]:
    return clean_env(MA_NUM_GPUS="2", MA_NUM_HOSTS=str(nodes), VC_TASK_INDEX=str(index), VC_WORKER_HOSTS=HOSTS)


def platform_args(index: int, nodes: int = 3) -> list[str]:
    return ["--init_method", "tcp://w-0.job:6666", "--rank", str(index), "--world_size", str(nodes)]


def plan(tmp_path: Path, body: str, engine: str = "pytorch", index: int = 1, nodes: int = 3):  # type: ignore[no-untyped-def]
    job = job_file(tmp_path, body)
    return run_cli(["plan", "--engine", engine, str(job), *platform_args(index, nodes)], platform(index, nodes))


@pytest.mark.parametrize(
    ("body", "engine", "nodes", "said"),
    [
        ("pytorch: {nnodes: '2:3'}\n", "mpi", 3, "run by the pytorch engine only"),
        ("pytorch: {nnodes: '4:6'}\n", "pytorch", 3, "allows at least 4 nodes; the platform (modelarts"),
        ("pytorch: {nnodes: '1:2'}\n", "pytorch", 3, "allows at most 2 nodes; the platform (modelarts"),
        ("elastic: {grow: at_checkpoint}\n", "pytorch", 3, "the job has no elastic node range"),
        ("elastic: {grow: soon}\npytorch: {nnodes: '2:3'}\n", "pytorch", 3, "'at_restart' or 'at_checkpoint'"),
    ],
)
def test_a_range_that_cannot_run_is_exit_2_naming_the_key(
    tmp_path: Path, body: str, engine: str, nodes: int, said: str
) -> None:
    result = plan(tmp_path, body, engine, nodes=nodes)
    assert result.code == 2 and result.traceback is None, (result.code, result.stderr[-800:])
    assert said in result.stderr and "line 3" in result.stderr, result.stderr


def test_a_range_that_holds_plans_the_platform_s_nodes_and_a_simulation_says_it_has_no_effect(tmp_path: Path) -> None:
    result = plan(tmp_path, "pytorch: {nnodes: '2:3'}\n")
    assert result.code == 0, result.stderr
    simulated = run_cli(["plan", "--engine", "pytorch", str(tmp_path / "job.yaml")], clean_env())
    assert simulated.code == 0 and "no node can leave or join" in simulated.stderr + simulated.stdout


def test_the_plan_of_a_resized_job_is_consistent_for_its_ranks(tmp_path: Path) -> None:
    """Node 2 of 3 after node 1 left: node rank 1 of 2, ranks 2-3 of 4, and the platform's variables say so."""
    job = load_job(job_file(tmp_path, "pytorch: {nnodes: '2:3'}\n"))
    engine = get_engine("pytorch")
    cluster = engine.detect(job, platform(2), platform_args(2))
    resized = engine.restart_cluster(resize(cluster, [0, 2]), 3)
    planned = plan_attempt(engine, job, resized, 3)
    assert (planned.nnodes, planned.world_size, planned.master_port) == (2, 4, 6669)
    envs = [p.env for p in planned.processes]
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("2", "0", "1", "4"),
        ("3", "1", "1", "4"),
    ]
    assert {(e["MA_NUM_HOSTS"], e["VC_TASK_INDEX"], e["VC_WORKER_HOSTS"]) for e in envs} == {
        ("2", "1", "w-0.job,w-2.job")
    }
    back = plan_attempt(engine, job, engine.restart_cluster(resize(cluster, [0, 1, 2]), 4), 4)
    assert back.processes[0].env["RANK"] == "4" and "MA_NUM_HOSTS" not in back.processes[0].env  # the platform's own
    with pytest.raises(ValueError, match="this node must be in it"):
        resize(cluster, [0, 1])
    plan_json = json.loads(json.dumps(planned.to_json()))
    assert plan_json["nodes"][0]["index"] == 1


def test_loading_checks_the_section_keys() -> None:
    with pytest.raises(UserError):
        from launchers.config.loader import parse_job

        parse_job("entry: t.py\nelastic: {grows: at_restart}\n", Path("job.yaml"))


def test_status_shows_the_newest_membership_change() -> None:
    """``mlaunch status``'s header: who left, who joined, the sizes (status.json's ``membership``)."""
    from launchers.cli.commands.status import membership_line

    change = {
        "attempt": 1,
        "members": [0, 1],
        "left": [{"node": 2, "host": "w-2", "why": "its mlaunch sent nothing for 3.1s", "silent_s": 3.1}],
        "joined": [],
        "nodes_before": 3,
        "nodes_after": 2,
        "world_before": 6,
        "world_after": 4,
        "regroup": None,
    }
    assert membership_line({"membership": change}) == (
        "membership at attempt 1: 3 → 2 nodes (6 → 4 ranks); nodes in the job: 0, 1; "
        "left: node 2 (w-2): its mlaunch sent nothing for 3.1s"
    )
    assert membership_line({}) is None  # a job whose membership never changed says nothing
