"""Seeing a job with the real parts (issue 46): Prometheus scrapes it, the timeline draws it, a browser shows it.

One job run serves every test here (a module fixture): 2 network-namespace hosts × 1 rank of the
PyTorch example under fault injection (``scripts/chaos_train.py``), ``pytorch.nnodes: "1:2"``,
``metrics: {port: 9464}``, one log directory both hosts write. Its life: rank 1 (host 1) kills
itself with SIGKILL at step 5 → flash save, restart; rank 0 (host 0) hangs at step 12 →
``monitor.hang_timeout`` declares it, restart; host 1's mlaunch is SIGKILLed → after
``node_timeout`` host 0 goes on alone (a shrink) to the last step.

A third namespace host runs Debian's real ``prometheus`` (scraping both hosts by name every
second); the test asks its HTTP API, as Grafana would. The finished job's timeline is drawn as a
PNG and checked pixel by pixel where the drawing says it put each mark; its HTML page is opened in
headless Chromium (Debian's ``chromium``) with the kill's mark pinned, and the screenshot checked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, needs_torch, run_mlaunch
from netns import Host, hosts_fixture
from test_membership_hosts import Launches

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_torch]

CHAOS = ROOT / "tests" / "scripts" / "chaos_train.py"
PORT = 9464
PROM_PORT = 9090
JOB = "observed"

hosts3 = pytest.fixture(hosts_fixture(3), name="hosts3", scope="module")


@dataclass
class Run:
    job: Path
    log_dir: Path
    tmp: Path
    text: str
    codes: dict[int, int]
    live: dict[str, Any] = field(default_factory=dict)  # what Prometheus answered while the job ran
    live_timeline: str = ""  # `mlaunch timeline` on the running job: its output


def _prometheus(host: Host, tmp: Path, targets: list[str]) -> subprocess.Popen[str]:
    config = tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: mlaunch\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
    )
    argv = [
        shutil.which("prometheus") or "prometheus",
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{PROM_PORT}",
    ]
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - open for the server's life
    return host.popen(argv, stdout=log, stderr=subprocess.STDOUT)


def query(host: Host, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """The result vector of a PromQL query (evaluated now, or ``at``), asked of the Prometheus on ``host``."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    url = f"http://127.0.0.1:{PROM_PORT}/api/v1/query?" + urllib.parse.urlencode(params)
    fetch = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    done = host.run([sys.executable, "-c", fetch, url], timeout=30)
    if done.returncode != 0:
        return []
    result: list[dict[str, Any]] = json.loads(done.stdout)["data"]["result"]
    return result


def by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def dashboard_queries() -> list[str]:
    """Every PromQL query of the Grafana dashboard in docs/, its variables set for this job."""
    board = json.loads((ROOT / "docs" / "grafana" / "mlaunch-dashboard.json").read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    return [e.replace("$job", JOB).replace("$__range", "5m") for e in exprs]


@pytest.fixture(scope="module")
def storm(hosts3: list[Host], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    for tool in ("prometheus", "chromium"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (.ci/run installs Debian's {tool})")
    tmp = tmp_path_factory.mktemp("observed")
    (tmp / "state").mkdir()
    job = tmp / "job.yaml"
    job.write_text(
        f"name: {JOB}\nengine: pytorch\nentry: {CHAOS}\nargs: ['--steps', '60', '--save-every', '5']\n"
        f"nodes: 2\nprocs_per_node: 1\nlog_dir: {tmp / 'logs'}\n"
        f"checkpoint: {{dir: {tmp / 'ckpt'}, grace_period: 8s, keep: 50, replicate: off}}\n"
        "restart: {max_restarts: 3, backoff: 0s}\nmonitor: {node_timeout: 3s, hang_timeout: 3s}\n"
        f"pytorch: {{nnodes: '1:2'}}\nmetrics: {{port: {PORT}}}\n"
    )
    hosts, watcher = hosts3[:2], hosts3[2]
    prometheus = _prometheus(watcher, tmp, [f"{h.name}:{PORT}" for h in hosts])
    plan = "1:5:kill9;0:12:hang"
    run = Launches(hosts, job, CHAOS_PLAN=plan, CHAOS_STATE=str(tmp / "state"), CHAOS_STEP_SLEEP="0.2")
    live: dict[str, Any] = {}
    began = time.time()
    try:
        run.start(0)
        run.start(1)
        run.wait_for(r"chaos fired 0 kill9", timeout=180)
        run.wait_for(r"chaos fired 1 hang", timeout=180)
        run.wait_for(r"step (1[4-9]|2\d) loss", host=0, timeout=120)  # the third attempt steps
        both = time.time()  # both nodes up, two restarts behind
        run.procs[1].kill()  # host 1's mlaunch SIGKILLed: its node is lost, the job shrinks to host 0
        run.wait_for(r"membership \(generation \d+\): 2 → 1 nodes", host=0, timeout=120)
        shown = run_mlaunch(["timeline", str(job), "-o", str(tmp / "running.png")])  # node 0 trains on meanwhile
        live_timeline = shown.stdout + shown.stderr
        codes = run.finish(timeout=240)
        time.sleep(2)  # the last scrapes
        # What Prometheus scraped while the job ran, asked after it (its samples stay):
        window = f"[{int(time.time() - began) + 60}s]"
        job_series = f'{{job_name="{JOB}"}}'
        live["restarts"] = by(query(watcher, f"max_over_time(mlaunch_restarts_total{job_series}{window})"), "cause")
        live["goodput"] = by(query(watcher, f"max_over_time(mlaunch_goodput_ratio{job_series}{window})"), "job_name")
        live["step"] = by(query(watcher, f"max_over_time(mlaunch_step{job_series}{window})"), "job_name")
        live["nodes"] = by(query(watcher, f"min_over_time(mlaunch_nodes{job_series}{window})"), "job_name")
        live["up"] = by(query(watcher, f"max_over_time(up{window})"), "instance")
        live["node_info"] = by(query(watcher, f"max_over_time(mlaunch_node_info{window})"), "node")
        live["dashboard"] = {expr: len(query(watcher, expr, at=both)) for expr in dashboard_queries()}
    finally:
        run.kill()
        prometheus.kill()
        prometheus.wait()
    yield Run(job, tmp / "logs", tmp, run.text(), codes, live, live_timeline)


def test_prometheus_scrapes_step_restarts_and_goodput_of_a_running_two_node_job(storm: Run) -> None:
    live = storm.live
    assert storm.codes[0] == 0, storm.text  # node 0 finished the training alone after the shrink
    assert live["restarts"] == {"sigkill": 1.0, "hang": 1.0, "node_left": 1.0}, (live, storm.text)
    assert 0.0 < live["goodput"][JOB] <= 1.0, live
    assert live["step"][JOB] >= 30, live  # the newest step every rank finished, past the shrink
    assert live["nodes"] == {JOB: 1.0}, live  # after the shrink
    assert set(live["node_info"]) == {"0", "1"} and set(live["up"].values()) == {1.0}, live  # both nodes served
    assert all(count > 0 for count in live["dashboard"].values()), live["dashboard"]  # every panel had data


def test_the_timeline_of_a_running_job_is_drawn_too(storm: Run) -> None:
    assert "timeline of observed (running, 2 node(s), " in storm.live_timeline, storm.live_timeline
    assert (storm.tmp / "running.png").stat().st_size > 20_000


def _near(pixel: tuple[int, ...], colour: str, tolerance: int = 40) -> bool:
    want = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], want, strict=True))


def _around(image: Any, x: float, y: float, colour: str, radius: int = 3) -> bool:
    for dx in range(-radius, radius + 1):
        for dy in range(-radius, radius + 1):
            if _near(image.getpixel((int(x) + dx, int(y) + dy)), colour):
                return True
    return False


def test_the_finished_jobs_png_shows_each_node_lane_and_the_kill_hang_shrink_restarts_and_resumes(storm: Run) -> None:
    from PIL import Image

    from launchers.observe import timeline_model
    from launchers.observe.timeline_draw import save_png
    from launchers.observe.timeline_style import FAULT_STYLE, NODE_COLOURS, OTHER_STYLE

    t = timeline_model.load([storm.log_dir])
    png = storm.tmp / "timeline.png"
    drawing = save_png(t, png)
    assert t.phase == "finished" and t.nodes == [0, 1], (t.phase, t.nodes)
    title = drawing.figure.axes[0].get_title(loc="left")
    assert title.startswith(f"job {JOB}: goodput ") and f" {len(t.faults())} fault(s)" in title, title
    once = [(m.kind, m.node) for m in t.faults() if m.kind in ("sigkill", "hang")]
    assert once == [("sigkill", 1), ("hang", 0)], once  # each node wrote its line of them: one mark each
    placed = {(p.kind, p.node) for p in drawing.placed}
    for want in [("sigkill", 1), ("hang", 0), ("node_left", 1), ("membership", None), ("restart", None)]:
        assert want in placed, (want, sorted(placed, key=str))
    assert {"resume", "commit_ranks", "commit_flash"} <= {kind for kind, _ in placed}, placed
    assert sum(1 for p in drawing.placed if p.kind == "resume") >= 3  # after the kill, the hang and the shrink
    assert {s.kind for s in t.spans} >= {"hang", "recovery_sigkill", "recovery_hang", "recovery_node_left"}
    assert {"sigkill", "hang", "node_left"} <= set(t.costs), t.costs

    image = Image.open(png).convert("RGB")
    for p in drawing.placed:  # each mark is where the drawing says, in its colour, on its node's lane
        colour = FAULT_STYLE[p.kind][0] if p.kind in FAULT_STYLE else OTHER_STYLE[p.kind][0]
        if p.kind in ("sigkill", "hang", "node_left", "commit_flash", "resume"):
            assert _around(image, p.x, p.y, colour), (p, image.getpixel((int(p.x), int(p.y))))
        if p.node is not None:
            top, bottom = drawing.lanes[f"node {p.node}"]
            assert top <= p.y <= bottom, (p, drawing.lanes)
    steps_panel = image.crop((100, 40, 1250, 400))  # both nodes' step lines are drawn
    colours = {c for _, c in steps_panel.getcolors(maxcolors=1 << 20) or []}
    for node_colour in NODE_COLOURS[:2]:
        assert any(_near(c, node_colour, 25) for c in colours), node_colour

    own = [e for e in timeline_model.gather([storm.log_dir])[0] if e.get("node") == 0]  # node 0's logs alone
    alone = timeline_model.build(own, [], JOB)
    assert alone.nodes == [0, 1] and any(m.kind == "sigkill" and m.node == 1 for m in alone.marks), alone.marks


def test_the_html_timeline_is_self_contained_and_chromium_shows_a_marks_detail(storm: Run) -> None:
    from PIL import Image

    from launchers.observe import timeline_model
    from launchers.observe.timeline_draw import draw

    page = storm.tmp / "timeline.html"
    shown = run_mlaunch(["timeline", str(storm.job), "-o", str(page)])
    assert shown.returncode == 0, shown.stderr
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text and "@import" not in text and "url(http" not in text
    kill = next(p for p in draw(timeline_model.load([storm.log_dir])).placed if p.kind == "sigkill")
    shot = storm.tmp / "shot.png"
    browse = [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu"]
    browse += ["--hide-scrollbars", "--window-size=1600,1100", f"--screenshot={shot}", f"{page.as_uri()}#{kill.gid}"]
    subprocess.run(browse, capture_output=True, timeout=120, check=True)
    image = Image.open(shot).convert("RGB")
    colours = dict((c, n) for n, c in image.getcolors(maxcolors=1 << 22) or [])
    tip = sum(n for c, n in colours.items() if _near(c, "#fffbe6", 3))  # the pinned detail box
    assert tip > 5_000, tip
    assert any(_near(c, "#d62728", 30) for c in colours), "the kill's red mark"
    box = [(x, y) for x in range(0, 1600, 4) for y in range(0, 1100, 4) if _near(image.getpixel((x, y)), "#fffbe6", 3)]
    assert box and min(x for x, _ in box) > 100, box[:5]  # beside the mark, not a blank page's colour
