"""The timeline drawn with matplotlib: steps over time, a lane per node with every mark, the goodput breakdown.

Three panels on one time axis (seconds, minutes or hours since the run started, by its length):

1. **steps**: the newest step each node's ranks all finished, a line per node (a thin line per
   rank where there are few); restarts as red dashed lines, resumes as green triangles with the step;
2. **lanes**: one row for the job (restarts, resumes, membership changes, health checks), one
   for commits (the ranks' saves, flash saves, background persists), one per node: each fault
   where it hit (marker by class, ``rank N`` beside it while there are few), a hang from the
   rank's last progress to its detection, a straggler from its report to its recovery, a node
   leaving or joining;
3. **goodput**: where the wall time went (productive, start-up, restarts, recomputed, checkpoint
   stalls, other), and what each fault class cost (the seconds without steps after them).

Behind all three, each recovery (last step before a fault → first step after) is shaded in its
class's colour. The title names the job, its goodput and its state; the legend names every
colour and marker used. Every mark and span carries an id (``ev<N>``) and a text: the HTML view
shows that text on hover (``timeline_html``). matplotlib is imported only here (``mlaunch[timeline]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launchers.observe.faults import CLASSES
from launchers.observe.timeline_model import Mark, Span, Timeline

FAULT_STYLE: dict[str, tuple[str, str]] = {  # class → (colour, marker)
    "sigkill": ("#d62728", "X"),
    "signal": ("#8c564b", "X"),
    "exit": ("#e377c2", "X"),
    "hang": ("#ff7f0e", "s"),
    "node_lost": ("#000000", "X"),
    "node_left": ("#9467bd", "v"),
    "node_joined": ("#2ca02c", "^"),
    "stop": ("#7f7f7f", "o"),
    "node_loss": ("#17becf", "D"),
}
OTHER_STYLE: dict[str, tuple[str, str, str]] = {  # kind → (colour, marker, legend)
    "restart": ("#d62728", "|", "restart (whole job)"),
    "resume": ("#2ca02c", ">", "resume (first steps after)"),
    "membership": ("#1f77b4", "d", "membership change"),
    "commit_ranks": ("#555555", "|", "commit (the ranks' save)"),
    "commit_flash": ("#9467bd", "D", "flash save (mlaunch, after a fault)"),
    "commit_background": ("#17becf", "|", "background persist commit"),
    "straggler": ("#bcbd22", "o", "straggler reported"),
    "health": ("#7f7f7f", "P", "health check"),
    "warning": ("#ff9896", "*", "warning (recomputed / started over)"),
    "end": ("#000000", "o", "end of the run"),
    "injected": ("#000000", "1", "fault injected by a test harness (as it says)"),
}
SPAN_STYLE: dict[str, tuple[str, str]] = {
    "hang": ("#ff7f0e", "hang: no progress until detected"),
    "straggler": ("#bcbd22", "straggler: slow until recovered"),
    "silent": ("#000000", "node silent until declared lost"),
}
NODE_COLOURS = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#e377c2", "#7f7f7f"]
GOODPUT_PARTS = [
    ("productive_s", "productive", "#2ca02c"),
    ("startup_s", "start-up", "#aec7e8"),
    ("restart_downtime_s", "restarts (down)", "#d62728"),
    ("recomputed_s", "recomputed", "#ff7f0e"),
    ("checkpoint_stall_s", "checkpoint stalls", "#9467bd"),
    ("other_s", "other (ends, failures, saves)", "#c7c7c7"),
]
FEW_FAULTS = 30  # up to this many, each fault's label is written beside it
FEW_RANKS = 16  # up to this many ranks, each has its own thin step line
JOB_LANE, COMMIT_LANE = "job", "commits"


@dataclass
class Placed:
    """Where the drawing put one mark (pixels of the PNG, origin top-left), for tests and the HTML hover."""

    gid: str
    kind: str
    node: int | None
    x: float
    y: float
    text: str


@dataclass
class Drawing:
    figure: Any
    placed: list[Placed] = field(default_factory=list)
    lanes: dict[str, tuple[float, float]] = field(default_factory=dict)  # lane name → (top, bottom) pixel rows
    hover: dict[str, str] = field(default_factory=dict)  # gid → text


def time_scale(seconds: float) -> tuple[float, str]:
    """(divisor, unit) for an x axis ``seconds`` long: s up to 5 min, min up to 3 h, then h."""
    if seconds <= 300:
        return 1.0, "s"
    if seconds <= 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def title(t: Timeline) -> str:
    g = t.goodput or {}
    wall = g.get("wall_s") or (t.t1 - t.t0)
    scale, unit = time_scale(wall)
    ratio = g.get("goodput")
    good = f"goodput {ratio * 100:.1f}%" if isinstance(ratio, (int, float)) else "goodput unknown (no progress reports)"
    estimate = " (so far, estimated)" if t.estimated else ""
    faults = len(t.faults())
    restarts = g.get("restarts", sum(1 for m in t.marks if m.kind == "restart"))
    state = t.phase + (f", exit {t.exit_code}" if t.exit_code is not None else "")
    return (
        f"job {t.job}: {good}{estimate} of {wall / scale:.1f} {unit} wall — {faults} fault(s), "
        f"{restarts} restart(s), {state}"
    )


def _lane_names(t: Timeline) -> list[str]:
    return [JOB_LANE, COMMIT_LANE, *(f"node {n}" for n in t.nodes)]


def draw(t: Timeline) -> Drawing:
    """The figure of ``t`` (not yet saved) and where its marks are."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lanes = _lane_names(t)
    lane_height = min(0.42, max(0.12, 9.0 / len(lanes)))
    lanes_in = max(1.6, lane_height * len(lanes))
    fig = plt.figure(figsize=(16, 4.2 + lanes_in + 2.0), dpi=100)
    grid = fig.add_gridspec(3, 1, height_ratios=[4.2, lanes_in, 1.6], hspace=0.32)
    ax_steps = fig.add_subplot(grid[0])
    ax_lanes = fig.add_subplot(grid[1], sharex=ax_steps)
    ax_good = fig.add_subplot(grid[2])
    drawing = Drawing(fig)
    scale, unit = time_scale(t.t1 - t.t0)

    def x(when: float) -> float:
        return (when - t.t0) / scale

    lane_y = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}
    used: dict[str, Any] = {}  # legend entries in order of use
    many = len(t.faults()) > FEW_FAULTS

    # -- recoveries behind everything
    for span in t.spans:
        if span.kind.startswith("recovery_"):
            cls = span.kind.removeprefix("recovery_")
            colour = FAULT_STYLE.get(cls, ("#999999", ""))[0]
            for ax in (ax_steps, ax_lanes):
                ax.axvspan(x(span.start), x(span.end), color=colour, alpha=0.10, lw=0)
            used.setdefault(
                "recovery",
                Patch(color="#d62728", alpha=0.15, label="recovery: last step → first step after (fault's colour)"),
            )

    # -- steps panel
    ranks = sorted(t.rank_steps)
    per_rank = 0 < len(ranks) <= FEW_RANKS
    widest = 1.5 + 2.5 * min(len(t.nodes) - 1, 3)  # lock-step nodes overlap: the first lines are widest
    for i, node in enumerate(t.nodes):
        colour = NODE_COLOURS[i % len(NODE_COLOURS)]
        width = max(1.5, widest - 2.5 * i)
        for segment in _by_attempt(t.steps.get(node, [])):  # no line across a restart: nothing ran there
            ax_steps.plot(
                [x(a) for a, _ in segment], [s for _, s in segment], "-o", ms=2.5, lw=width, color=colour, alpha=0.85
            )
        if t.steps.get(node):
            used.setdefault(
                f"node {node}", Line2D([], [], color=colour, lw=2, label=f"node {node}: steps (all its ranks)")
            )
        if per_rank:
            for rank in ranks:
                if t.rank_nodes.get(rank) == node:
                    for segment in _by_attempt(t.rank_steps[rank]):
                        ax_steps.plot(
                            [x(a) for a, _ in segment], [s for _, s in segment], "-", lw=0.7, alpha=0.5, color=colour
                        )
    ax_steps.set_ylabel("step (newest finished)")
    ax_steps.grid(True, alpha=0.3)
    ax_steps.set_title(title(t), fontsize=13, loc="left", fontweight="bold")
    for m in t.marks:
        if m.kind == "restart":
            ax_steps.axvline(x(m.time), color="#d62728", ls="--", lw=0.9, alpha=0.7)
        elif m.kind == "membership":
            ax_steps.axvline(x(m.time), color="#1f77b4", ls="-.", lw=1.0, alpha=0.8)

    # -- lanes panel
    counter = iter(range(10**9))

    def put(ax: Any, when: float, lane: str, colour: str, marker: str, size: float, text: str, m: Any) -> None:
        gid = f"ev{next(counter)}"
        ax.plot(
            [x(when)],
            [lane_y[lane]],
            marker=marker,
            color=colour,
            ms=size,
            mec="white" if marker not in "|" else colour,
            mew=0.6 if marker != "|" else 2,
            ls="none",
            gid=gid,
            zorder=5,
        )
        drawing.hover[gid] = _hover(m)
        drawing.placed.append(Placed(gid, m.kind, m.node, x(when), lane_y[lane], text))

    size = 9 if not many else 6
    for span in t.spans:
        if span.kind in SPAN_STYLE:
            lane = f"node {span.node}" if span.node is not None and f"node {span.node}" in lane_y else JOB_LANE
            colour, legend = SPAN_STYLE[span.kind]
            y = lane_y[lane]
            gid = f"ev{next(counter)}"
            ax_lanes.barh(
                y,
                x(span.end) - x(span.start),
                left=x(span.start),
                height=0.5,
                color=colour,
                alpha=0.45,
                hatch="//" if span.kind == "hang" else None,
                edgecolor=colour,
                gid=gid,
            )
            drawing.hover[gid] = _hover(span)
            used.setdefault(
                f"span {span.kind}",
                Patch(facecolor=colour, alpha=0.45, hatch="//" if span.kind == "hang" else None, label=legend),
            )
    for m in t.marks:
        if m.kind in FAULT_STYLE:
            colour, marker = FAULT_STYLE[m.kind]
            lane = f"node {m.node}" if m.node is not None and f"node {m.node}" in lane_y else JOB_LANE
            put(ax_lanes, m.time, lane, colour, marker, size + 2, m.label, m)
            if not many:
                ax_lanes.annotate(
                    m.label,
                    (x(m.time), lane_y[lane]),
                    xytext=(6, 5),
                    textcoords="offset points",
                    fontsize=8,
                    color=colour,
                    clip_on=True,  # a label near the right edge stops at the panel, not in the legend
                )
            used.setdefault(
                m.kind,
                Line2D(
                    [],
                    [],
                    color=colour,
                    marker=marker,
                    ls="none",
                    ms=9,
                    label=CLASSES.get(m.kind, m.kind) if m.kind in CLASSES else "machine loss (replication)",
                ),
            )
        elif m.kind in OTHER_STYLE:
            colour, marker, legend = OTHER_STYLE[m.kind]
            lane = COMMIT_LANE if m.kind.startswith("commit_") else JOB_LANE
            if m.kind in ("straggler", "injected") and m.node is not None and f"node {m.node}" in lane_y:
                lane = f"node {m.node}"
            put(ax_lanes, m.time, lane, colour, marker, size if marker != "|" else size + 3, m.label, m)
            if m.kind in ("membership", "resume") and not many:
                ax_lanes.annotate(
                    m.label,
                    (x(m.time), lane_y[lane]),
                    xytext=(5, 5 if m.kind == "resume" else -11),
                    textcoords="offset points",
                    fontsize=8,
                    color=colour,
                    clip_on=True,  # a label near the right edge stops at the panel, not in the legend
                )
            if m.kind == "resume":
                step = _step_at(t, m.time)
                if step is not None:
                    ax_steps.plot([x(m.time)], [step], marker=">", color=colour, ms=9, ls="none", zorder=6)
            used.setdefault(
                m.kind,
                Line2D(
                    [], [], color=colour, marker=marker, ls="none", ms=9, mew=2 if marker == "|" else 0.6, label=legend
                ),
            )
    ax_lanes.set_yticks(list(lane_y.values()), list(lane_y.keys()), fontsize=9)
    ax_lanes.set_ylim(-0.6, len(lanes) - 0.4)
    for y in lane_y.values():
        ax_lanes.axhline(y, color="#dddddd", lw=0.6, zorder=0)
    ax_lanes.grid(True, axis="x", alpha=0.3)
    ax_lanes.set_xlabel(f"time since the run started ({unit})")
    ax_lanes.set_xlim(0, x(t.t1) * 1.01)
    ax_steps.tick_params(labelbottom=True)

    # -- goodput panel
    _goodput_panel(ax_good, t)

    fig.legend(
        handles=list(used.values()),
        loc="upper right",
        bbox_to_anchor=(0.995, 0.995),
        fontsize=8,
        framealpha=0.9,
        ncol=1,
    )
    fig.subplots_adjust(left=0.07, right=0.80, top=0.95, bottom=0.07)
    fig.canvas.draw()
    _to_pixels(drawing, ax_lanes, lane_y)
    return drawing


def _by_attempt(series: list[tuple[float, int, int]]) -> list[list[tuple[float, int]]]:
    """A step series cut where the attempt changes."""
    out: list[list[tuple[float, int]]] = []
    current = None
    for when, step, attempt in series:
        if attempt != current or not out:
            out.append([])
            current = attempt
        out[-1].append((when, step))
    return out


def _step_at(t: Timeline, when: float) -> int | None:
    near = [s for series in t.steps.values() for tt, s, _ in series if abs(tt - when) < 1e-6]
    return min(near) if near else None


def _hover(item: Mark | Span) -> str:
    detail = {k: v for k, v in item.detail.items() if k not in ("job",)}
    head = item.label
    import json
    import time as _time

    when = item.time if isinstance(item, Mark) else item.start
    stamp = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(when))
    return f"{head}\n{stamp}\n" + json.dumps(detail, indent=1, default=str, ensure_ascii=False)[:2000]


def _goodput_panel(ax: Any, t: Timeline) -> None:
    g = t.goodput or {}
    wall = float(g.get("wall_s") or 0.0)
    ax.set_yticks([1, 0], ["wall time", "lost to faults"], fontsize=9)
    ax.set_ylim(-0.6, 1.6)
    left, small = 0.0, []
    if wall > 0 and g.get("productive_s") is not None:
        for key, name, colour in GOODPUT_PARTS:
            value = float(g.get(key) or 0.0)
            if value <= 0:
                continue
            ax.barh(1, value, left=left, color=colour, height=0.6, edgecolor="white")
            text = f"{name} {value:.1f}s ({value / wall * 100:.0f}%)"
            if value / wall > 0.15:
                ax.text(left + value / 2, 1, text, ha="center", va="center", fontsize=8)
            else:  # too narrow to hold its words: said above the bar, in order
                small.append(text)
            left += value
        if small:
            ax.text(0.0, 1.36, " · ".join(small), transform=ax.get_yaxis_transform(), fontsize=8, va="bottom")
    else:
        ax.text(
            0.01,
            1,
            "no rank reported progress: only the wall time is known",
            transform=ax.get_yaxis_transform(),
            va="center",
            fontsize=9,
        )
    shift, said = 0.0, []
    names = {"sigkill": "kill -9", "node_left": "node left", "node_lost": "node lost", "node_joined": "node joined"}
    for cls, (count, seconds) in sorted(t.costs.items(), key=lambda kv: -kv[1][1]):
        colour = FAULT_STYLE.get(cls, ("#999999", ""))[0]
        ax.barh(0, seconds, left=shift, color=colour, height=0.6, alpha=0.8, edgecolor="white")
        said.append(f"{names.get(cls, cls)} ×{count}: {seconds:.1f}s")
        shift += seconds
    if said:
        span = max(wall, shift, 1e-3)
        ax.text(shift + span * 0.01, 0, " · ".join(said), va="center", fontsize=8)
    ax.set_xlim(0, max(wall, shift, 1e-3) * 1.01)
    ax.set_xlabel(
        "seconds of the run (top: where the wall time went; bottom: time without steps after each fault class)"
    )
    ax.grid(True, axis="x", alpha=0.3)


def _to_pixels(drawing: Drawing, ax: Any, lane_y: dict[str, float]) -> None:
    """Data coordinates of the lanes panel → PNG pixels (origin top-left)."""
    height = drawing.figure.bbox.height
    for p in drawing.placed:
        px, py = ax.transData.transform((p.x, p.y))
        p.x, p.y = float(px), float(height - py)
    for name, y in lane_y.items():
        _, top = ax.transData.transform((0, y + 0.25))
        _, bottom = ax.transData.transform((0, y - 0.25))
        drawing.lanes[name] = (float(height - top), float(height - bottom))


def save_png(t: Timeline, path: Any) -> Drawing:
    drawing = draw(t)
    drawing.figure.savefig(path, format="png")
    return drawing
