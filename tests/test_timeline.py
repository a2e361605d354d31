"""The timeline and the metrics in their parts (issue 46): fast, without a job run.

What a real job gives them is tested in ``test_observe_real.py`` (network-namespace hosts, a real
Prometheus, a real browser); here the pieces a job's run does not reach cheaply: a long job with
hundreds of faults, several runs in one log directory, the metrics served over real HTTP, a port
already taken, job.yaml's ``metrics:`` section, the manifests' scrape annotations, the command's
user errors. The events are events.jsonl records as the observer writes them.
"""

from __future__ import annotations

import json
import random
import re
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import run_mlaunch

from launchers.config.job import load_job
from launchers.errors import UserError
from launchers.observe import metrics, timeline_model
from launchers.observe.progress_log import progress_every

T0 = 1_700_000_000.0


def ev(t: float, event: str, **fields: Any) -> dict[str, Any]:
    return {"time": T0 + t, "event": event, "job": "long", **fields}


def long_job(hours: float = 3.0, faults: int = 240, nodes: int = 8, seed: int = 7) -> list[dict[str, Any]]:
    """A job of ``hours`` with ``faults`` faults of mixed classes, as its events.jsonl would hold them."""
    rng = random.Random(seed)
    events = [ev(0, "start", attempt=0, ranks=list(range(nodes * 2)))]
    t, step = 5.0, 0
    span = hours * 3600 / faults
    for attempt in range(faults):
        end = t + span * rng.uniform(0.5, 1.5)
        while t < end:
            step += 10
            for node in range(nodes):
                events.append(
                    ev(t, "progress", node=node, attempt=attempt, steps={str(2 * node): step, str(2 * node + 1): step})
                )
            t += 30.0
        kind = rng.choice(["kill", "hang", "exit", "shrink"])
        victim = rng.randrange(nodes)
        if kind == "kill":
            events.append(
                ev(
                    t,
                    "failure",
                    attempt=attempt,
                    rank=2 * victim,
                    label=f"node {victim} rank {2 * victim}",
                    exit_code=137,
                    signal=9,
                    cause="",
                )
            )
        elif kind == "hang":
            events.append(
                ev(
                    t,
                    "hang",
                    attempt=attempt,
                    rank=2 * victim,
                    label=f"node {victim} rank {2 * victim}",
                    exit_code=137,
                    cause="hung: no progress for 1m",
                )
            )
        elif kind == "exit":
            events.append(
                ev(
                    t,
                    "failure",
                    attempt=attempt,
                    rank=2 * victim,
                    label=f"node {victim} rank {2 * victim}",
                    exit_code=1,
                    cause="",
                )
            )
        else:
            events.append(ev(t, "regroup", attempt=attempt, cause="a node left"))
            events.append(
                ev(
                    t + 1,
                    "membership",
                    attempt=attempt + 1,
                    left=[{"node": victim, "why": "its mlaunch sent nothing for 30.0s", "silent_s": 30.0}],
                    joined=[],
                    nodes_before=nodes,
                    nodes_after=nodes,
                )
            )
        events.append(ev(t + 1.5, "checkpoint", attempt=attempt, step=step, source="flash"))
        events.append(ev(t + 2, "restart", attempt=attempt + 1, delay_s=0))
        events.append(ev(t + 2, "start", attempt=attempt + 1, ranks=list(range(nodes * 2))))
        step -= 5
        t += 40.0
    events.append(
        ev(
            t,
            "end",
            exit_code=0,
            wall_s=t,
            productive_s=t * 0.7,
            goodput=0.7,
            startup_s=t * 0.1,
            restarts=faults,
            restart_downtime_s=t * 0.05,
            recomputed_steps=5 * faults,
            recomputed_s=t * 0.05,
            checkpoint_stall_s=t * 0.02,
            other_s=t * 0.08,
        )
    )
    return events


def test_a_three_hour_job_with_240_faults_draws_one_lane_per_node_in_hours_with_every_fault(tmp_path: Path) -> None:
    from launchers.observe.timeline_draw import save_png

    events = long_job()
    t = timeline_model.build(events)
    assert t.nodes == list(range(8)) and t.phase == "finished" and not t.estimated
    assert len(t.faults()) == sum(1 for e in events if e["event"] in ("failure", "hang"))
    assert set(t.costs) == {"sigkill", "hang", "exit", "node_left"}
    drawing = save_png(t, tmp_path / "long.png")
    lanes = drawing.figure.axes[1]
    assert lanes.get_xlabel() == "time since the run started (h)"
    assert [tick.get_text() for tick in lanes.get_yticklabels()][-1] == "node 7"
    assert re.match(
        r"job long: goodput 70.0% of \d+\.\d h wall — \d+ fault\(s\)", drawing.figure.axes[0].get_title(loc="left")
    )
    faults = [p for p in drawing.placed if p.kind in ("sigkill", "hang", "exit")]
    assert len(faults) == len(t.faults())  # every fault drawn, none dropped for density
    for p in faults:
        top, bottom = drawing.lanes[f"node {p.node}"]
        assert top <= p.y <= bottom


def test_only_the_newest_run_of_a_log_directory_is_drawn_and_a_running_one_is_estimated() -> None:
    old = [
        ev(0, "start", attempt=0),
        ev(1, "failure", attempt=0, rank=0, label="node 0 rank 0", exit_code=1),
        ev(2, "end", exit_code=1),
    ]
    new = [
        ev(10, "start", attempt=0),
        ev(11, "progress", node=0, attempt=0, steps={"0": 1}),
        ev(14, "progress", node=0, attempt=0, steps={"0": 9}),
    ]
    status = {"updated": T0 + 14, "phase": "failed", "nodes": [{"index": 0, "ranks": [{"rank": 0, "step": 10}]}]}
    t = timeline_model.build(old + new, [status], now=T0 + 20)  # "failed" for a moment: between two attempts
    assert t.t0 == T0 + 10 and t.faults() == [] and t.running and t.estimated
    assert t.steps[0][-1] == (T0 + 14, 10, 0)  # the status view's newest step
    gone = timeline_model.build(old + new, [status], now=T0 + 100)  # nothing written for long, no end event
    assert not gone.running and gone.phase.startswith("unfinished")
    assert t.goodput is not None and 0 < t.goodput["goodput"] <= 1  # 3 s of steps in 4 s so far


def test_a_straggler_is_a_bar_on_its_nodes_lane_from_its_report_to_its_recovery(tmp_path: Path) -> None:
    from launchers.observe.timeline_draw import save_png

    events = [
        ev(0, "start", attempt=0),
        *(ev(1 + i, "progress", node=i % 2, attempt=0, steps={str(i % 2): 10 * i}) for i in range(8)),
        ev(2, "straggler", node=1, rank=1, step=12, own_step_time_s=0.3, median_s=0.1),
        ev(6, "straggler_recovered", node=1, rank=1, step=50, own_step_time_s=0.1, median_s=0.1),
        ev(9, "end", exit_code=0, wall_s=9.0, productive_s=7.0, goodput=0.78),
    ]
    events.insert(-1, ev(7, "kept_in_place", attempt=0, ranks=["node 0 rank 0"]))  # main's in-place recovery
    t = timeline_model.build(events)
    assert [m.label for m in t.marks if m.kind == "in_place"] == ["kept in place: 1 rank(s)"]
    (bar,) = [s for s in t.spans if s.kind == "straggler"]
    assert (bar.start, bar.end, bar.node) == (T0 + 2, T0 + 6, 1)
    drawing = save_png(t, tmp_path / "straggler.png")
    (mark,) = [p for p in drawing.placed if p.kind == "straggler"]
    top, bottom = drawing.lanes["node 1"]
    assert top <= mark.y <= bottom


def test_a_fault_is_classified_alike_for_the_timeline_and_for_the_restart_counter() -> None:
    fold = metrics.EventFold()
    run = [
        ev(0, "start", attempt=0),
        ev(1, "failure", attempt=0, rank=3, label="node 1 rank 3", signal=9, exit_code=137),
        ev(1, "restart", attempt=1),
        ev(1, "start", attempt=1),
        ev(2, "hang", attempt=1, rank=0, label="node 0 rank 0", exit_code=137, cause="hung: no progress"),
        ev(2, "start", attempt=2),
        ev(3, "regroup", attempt=2, cause="node 1 left"),
        ev(3, "membership", attempt=3, left=[{"node": 1, "why": "silent"}], joined=[]),
        ev(4, "start", attempt=3),
        ev(5, "failure", attempt=3, rank=0, label="node 0 rank 0", exit_code=1),
        ev(6, "start", attempt=4),
        ev(7, "failure", attempt=4, rank=0, label="node 0 rank 0", exit_code=1),  # its peer vanished mid-collective
        ev(8, "membership", attempt=5, left=[{"node": 1, "why": "silent"}], joined=[]),  # ... which explains it
        ev(9, "start", attempt=5),
    ]
    for e in run:
        fold.feed(e)
    assert fold.restarts == {"sigkill": 1, "hang": 1, "node_left": 2, "exit": 1} and fold.hangs == 1
    t = timeline_model.build(run)
    assert [(m.kind, m.node) for m in t.faults()] == [("sigkill", 1), ("hang", 0), ("exit", 0), ("exit", 0)]


def test_the_metrics_are_served_over_http_and_a_taken_port_is_said_not_fatal() -> None:
    server, error = metrics.serve(0, "demo", 0, True)
    assert server is not None and error is None
    try:
        fold = metrics.EventFold()
        for e in [ev(0, "start", attempt=0), ev(1, "failure", signal=9, exit_code=137), ev(2, "start", attempt=1)]:
            fold.feed(e)
        status = {
            "attempt": 1,
            "nodes": [
                {
                    "index": 0,
                    "ranks": [{"rank": 0, "step": 12, "step_time_s": 0.2}, {"rank": 1, "step": 11, "step_time_s": 0.3}],
                }
            ],
        }
        server.update(
            metrics.figures_from("demo", status, {"goodput": 0.5, "wall_s": 10.0, "commits": {"flash": 1}}, fold, None)
        )
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
        for line in [
            'mlaunch_step{job_name="demo"} 11.0',
            'mlaunch_restarts_total{cause="sigkill",job_name="demo"} 1.0',
            'mlaunch_goodput_ratio{job_name="demo"} 0.5',
            'mlaunch_step_time_seconds{job_name="demo"} 0.25',
            'mlaunch_commits_total{by="flash",job_name="demo"} 1.0',
            'mlaunch_nodes{job_name="demo"} 1.0',
        ]:
            assert line in text, text
        with socket.socket() as taken:
            taken.bind(("0.0.0.0", 0))
            taken.listen()
            again, why = metrics.serve(taken.getsockname()[1], "demo", 0, True)
        assert again is None and why is not None and "cannot serve metrics on port" in why
    finally:
        server.close()


def test_a_taken_metrics_port_is_said_in_the_events_and_the_status_view_and_the_run_goes_on(tmp_path: Path) -> None:
    from launchers.observe.events_log import EventLog, read_events
    from launchers.observe.goodput import Goodput
    from launchers.observe.metrics_hook import MetricsHook

    log = EventLog(tmp_path, 0, "demo")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        hook = MetricsHook(taken.getsockname()[1], "demo", 0, True, log)
    assert hook.server is None and "cannot serve metrics" in hook.state["error"]  # status.json's "metrics"
    (said,) = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "metrics"]
    assert said["error"] == hook.state["error"], said
    hook.publish({"nodes": []}, Goodput(0.0))  # nothing to serve: nothing breaks
    hook.close()


def test_progress_events_come_about_a_hundred_per_run_between_half_a_second_and_thirty() -> None:
    assert progress_every(0) == 0.5 and progress_every(600) == 6.0 and progress_every(86400) == 30.0


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("metrics: {port: 70000}", "key 'metrics.port'"),
        ("metrics: {prot: 9100}", "unknown key 'metrics.prot'"),
        ("metrics: {port: '9100'}", "key 'metrics.port'"),
    ],
)
def test_a_bad_metrics_section_names_file_line_and_key(tmp_path: Path, section: str, said: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: demo\nentry: train.py\n{section}\n")
    with pytest.raises(UserError, match=r"job.yaml, line 3: " + said.replace(".", r"\.")):
        load_job(job)
    shown = run_mlaunch(["check", str(job)])
    assert shown.returncode == 2 and said in shown.stderr and "Traceback" not in shown.stderr


def test_the_manifest_exposes_the_metrics_port_with_scrape_annotations_only_when_set(tmp_path: Path) -> None:
    from launchers.generate.k8s.manifests import build

    (tmp_path / "train.py").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text("name: demo\nentry: train.py\nnodes: 2\nkubernetes: {image: img:1}\nmetrics: {port: 9400}\n")
    template = build(load_job(job), "volcano", "pytorch").documents[0]["spec"]["tasks"][0]["template"]
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "prometheus.io/path": "/metrics",
    }
    assert {"containerPort": 9400, "name": "metrics"} in template["spec"]["containers"][0]["ports"]
    job.write_text("name: demo\nentry: train.py\nnodes: 2\nkubernetes: {image: img:1}\n")
    plain = build(load_job(job), "pytorchjob", "pytorch").documents[0]["spec"]["pytorchReplicaSpecs"]["Master"]
    assert "annotations" not in plain["template"]["metadata"]
    job.write_text("name: demo\nentry: train.py\nkubernetes: {image: img:1}\nmetrics: {port: 23456}\n")
    with pytest.raises(UserError, match="metrics.port 23456 is also the pod's pytorchjob-port port"):
        build(load_job(job), "pytorchjob", "pytorch")


def test_the_command_refuses_a_suffix_it_cannot_draw_and_a_job_without_events(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: demo\nentry: train.py\nlog_dir: logs\n")
    shown = run_mlaunch(["timeline", str(job), "-o", str(tmp_path / "t.svg")])
    assert shown.returncode == 2 and "a .png or an .html file" in shown.stderr
    shown = run_mlaunch(["timeline", str(job), "-o", str(tmp_path / "t.png")])
    assert shown.returncode == 2 and "no logs at" in shown.stderr
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "events.jsonl").write_text("")
    shown = run_mlaunch(["timeline", str(job), "-o", str(tmp_path / "t.png")])
    assert shown.returncode == 2 and "no events in" in shown.stderr


def test_gathered_logs_of_every_node_make_one_timeline(tmp_path: Path) -> None:
    """Each node's own log directory copied into one place: every node's lane, each event once."""
    events = long_job(hours=0.2, faults=4, nodes=2)
    for node in (0, 1):
        mine = [e for e in events if e.get("node") in (node, None)]
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in mine))
    t = timeline_model.load([tmp_path])
    assert t.nodes == [0, 1] and len(t.faults()) == len(timeline_model.build(events).faults())
    assert all(t.steps[n] for n in (0, 1))
