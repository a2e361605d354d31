"""The health check's pure parts: the verdict rules, the pairing schedules, the gate, the job.yaml section.

Measurements here are hand-written dicts (the shape ``check.measure_local`` produces): the
rules are arithmetic on them, and the netns tests (test_health_hosts.py) measure for real.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, run_mlaunch

from launchers.config.job import load_job
from launchers.health.check import HEALTH_EXIT_CODE, HealthOutcome
from launchers.health.gate import decide, elastic_minimum
from launchers.health.network import fastest_with_slowest, neighbours, round_robin, third_partner
from launchers.health.verdict import Rules, judge
from launchers.platform.cluster import Cluster

FAST, SLOW = 0.002, 0.4


def node(
    host: str, compute: float = 0.001, links: dict[int, float | None] | None = None, **extra: Any
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "host": host,
        "compute": {"seconds_per_op": compute, "gflops": 1.0},
        "memory": {"devices": []},
        "storage": {"writable": True, "free_bytes": 50 << 30, "write_mb_s": 300.0},
        "links": {str(k): v for k, v in (links or {}).items()},
    }
    result.update(extra)
    return result


def mesh(nnodes: int, slow_nodes: set[int], failed: set[int] = frozenset()) -> dict[int, dict[str, Any]]:  # type: ignore[assignment]
    """Every pair measured; a pair touching a slow node is slow, one touching a failed node failed."""
    results = {}
    for i in range(nnodes):
        links: dict[int, float | None] = {}
        for j in range(nnodes):
            if j != i:
                links[j] = None if {i, j} & failed else (SLOW if {i, j} & slow_nodes else FAST)
        results[i] = node(f"h{i}", links=links)
    return results


def verdicts_of(results: dict[int, Any], nnodes: int, **rules: Any) -> dict[int, str]:
    return {v.index: v.verdict for v in judge(results, nnodes, Rules(**rules), {})}


@pytest.mark.parametrize("nnodes", [3, 4, 5, 8])
def test_a_node_whose_every_link_is_slow_is_named_from_three_nodes(nnodes: int) -> None:
    for bad in range(nnodes):
        verdicts = verdicts_of(mesh(nnodes, {bad}), nnodes)
        assert [i for i, v in verdicts.items() if v != "ok"] == [bad]


def test_two_bad_links_among_four_are_both_named_the_lower_median_is_not_dragged_up() -> None:
    verdicts = verdicts_of(mesh(4, {1, 3}), 4)
    assert verdicts == {0: "ok", 1: "straggler", 2: "ok", 3: "straggler"}


def test_two_nodes_cannot_localise_a_slow_link_and_a_failed_link_makes_both_faulty() -> None:
    assert verdicts_of(mesh(2, {1}), 2) == {0: "ok", 1: "ok"}
    assert verdicts_of(mesh(2, set(), failed={1}), 2) == {0: "faulty", 1: "faulty"}


def test_a_node_with_no_working_link_is_faulty_the_others_not() -> None:
    assert verdicts_of(mesh(4, set(), failed={2}), 4) == {0: "ok", 1: "ok", 2: "faulty", 3: "ok"}


def test_compute_straggler_is_factor_times_the_median_and_one_node_is_never_one() -> None:
    results = {i: node(f"h{i}", compute=t) for i, t in enumerate([0.001, 0.0011, 0.0019, 0.005])}
    assert verdicts_of(results, 4) == {0: "ok", 1: "ok", 2: "ok", 3: "straggler"}
    assert verdicts_of(results, 4, factor=6.0) == {i: "ok" for i in range(4)}
    assert verdicts_of({0: node("h0", compute=9.0)}, 1) == {0: "ok"}


def test_link_noise_of_a_few_milliseconds_on_a_fast_network_is_not_a_straggler() -> None:
    """Best links 1 ms, 1 ms, 5 ms: 5× the median but within LINK_SLACK (4 ms more); 7 ms would count."""
    for best, expected in ((0.005, "ok"), (0.007, "straggler")):
        results = mesh(3, set())
        results[0]["links"] = {"1": 0.001, "2": best}
        results[1]["links"] = {"0": 0.001, "2": best}
        results[2]["links"] = {"0": best, "1": best}
        assert verdicts_of(results, 3) == {0: "ok", 1: "ok", 2: expected}


def test_local_faults_device_memory_storage_missing_result() -> None:
    results: dict[int, Any] = {
        0: node("h0", memory={"devices": [{"index": 0, "used_fraction": 0.31}, {"index": 1, "used_fraction": 0.0}]}),
        1: node("h1", storage={"writable": False, "error": "checkpoint directory /x: Permission denied"}),
        2: node("h2", storage={"writable": True, "free_bytes": 100 << 20}),
        3: None,
        4: node("h4", memory={"devices": [{"index": 0, "used_fraction": 0.29}]}),
    }
    verdicts = {v.index: v for v in judge(results, 6, Rules(), {5: "gone-host"})}
    assert [verdicts[i].verdict for i in range(6)] == ["faulty", "faulty", "faulty", "faulty", "ok", "faulty"]
    assert "device 0 has 31%" in verdicts[0].reason
    assert "Permission denied" in verdicts[1].reason
    assert "GiB free" in verdicts[2].reason
    assert verdicts[5].host == "gone-host" and "no health result" in verdicts[5].reason


def test_round_robin_pairs_every_two_nodes_exactly_once_in_disjoint_rounds() -> None:
    for nnodes in range(2, 10):
        rounds = round_robin(nnodes)
        pairs = [p for r in rounds for p in r]
        assert sorted(pairs) == list(itertools.combinations(range(nnodes), 2))
        for r in rounds:
            members = [n for p in r for n in p]
            assert len(members) == len(set(members))


def test_dlrover_rounds_for_large_jobs_and_a_third_partner() -> None:
    assert neighbours(5) == [(0, 1), (2, 3)]
    assert fastest_with_slowest({0: 1.0, 1: 5.0, 2: 2.0, 3: 3.0}) == [(0, 1), (2, 3)]
    used = set(neighbours(10)) | set(fastest_with_slowest({i: float(i) for i in range(10)}))
    third = third_partner(10, used)
    assert not set(third) & used and len(third) >= 4


def cluster(nnodes: int, node_rank: int = 0, spec: str | None = None) -> Cluster:
    return Cluster("test", False, nnodes, node_rank, 1, "10.0.0.1", 6666, nnodes_spec=spec)


def job_file(tmp_path: Path, health: str, extra: str = "") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: hc\nengine: pytorch\nentry: train.py\nnodes: 3\nlog_dir: {tmp_path / 'logs'}\n"
        f"checkpoint: {{dir: {tmp_path / 'ckpt'}}}\nhealth_check: {health}\n{extra}"
    )
    (tmp_path / "train.py").write_text("print('trained')\n")
    return path


def test_gate_fail_exclude_warn(tmp_path: Path) -> None:
    results = mesh(4, {3})
    outcome = HealthOutcome(judge(results, 4, Rules(), {}), 1.0)
    fail = load_job(job_file(tmp_path, "{on_failure: fail}"))
    assert decide(fail, cluster(4), outcome) == HEALTH_EXIT_CODE
    warn = load_job(job_file(tmp_path, "{on_failure: warn}"))
    assert decide(warn, cluster(4), outcome) is None
    exclude = load_job(job_file(tmp_path, "{on_failure: exclude}", "pytorch: {nnodes: '3:4'}"))
    assert elastic_minimum(exclude, cluster(4)) == 3
    assert decide(exclude, cluster(4, 0), outcome) is None  # a good node starts without host 3
    assert decide(exclude, cluster(4, 3), outcome) == HEALTH_EXIT_CODE  # the bad one is left out
    no_range = load_job(job_file(tmp_path, "{on_failure: exclude}"))
    assert decide(no_range, cluster(4), outcome) == HEALTH_EXIT_CODE
    assert decide(exclude, cluster(4), HealthOutcome(judge(mesh(4, {2, 3}), 4, Rules(), {}), 1.0)) == HEALTH_EXIT_CODE


def test_job_yaml_health_check_section_is_strict(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "{before_start: true, on_failure: exclude, straggler_factor: 3, timeout: 20s}"))
    assert job.health_check.before_start and job.health_check.straggler_factor == 3.0
    assert job.health_check.timeout == 20.0
    bad = run_mlaunch(["check", str(job_file(tmp_path, "{on_failure: retry}"))])
    assert bad.returncode != 0 and "on_failure" in bad.stderr


def test_simulated_health_command_and_run_hook(tmp_path: Path) -> None:
    """A local simulation of 3 nodes: every part runs (links over loopback), health.json has every node."""
    job = job_file(tmp_path, "{before_start: true, on_failure: fail, straggler_factor: 50}")
    result = run_mlaunch(["health", str(job)], env=clean_env())
    doc = json.loads((tmp_path / "logs" / "health.json").read_text())
    assert [n["index"] for n in doc["nodes"]] == [0, 1, 2], result.stderr
    assert all(set(n["links"]) == {str(j) for j in range(3) if j != n["index"]} for n in doc["nodes"]), doc
    assert result.returncode == (0 if not doc["bad_hosts"] else HEALTH_EXIT_CODE), result.stderr
    assert "node  host" in result.stderr
