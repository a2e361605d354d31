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
from launchers.observe.timeline_style import (
    COMMIT_LANE,
    FAULT_STYLE,
    FEW_FAULTS,
    FEW_RANKS,
    GOODPUT_PARTS,
    JOB_LANE,
    NODE_COLOURS,
    OTHER_STYLE,
    SPAN_STYLE,
    lane_names,
    time_scale,
    title,
)


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


def draw(t: Timeline) -> Drawing:
    """The figure of ``t`` (not yet saved) and where its marks are."""
    painter = _Painter(t)
    painter.recoveries()
    painter.steps()
    painter.spans()
    for m in t.marks:
        painter.mark(m)
    return painter.finish()


class _Painter:
    """One figure: the three panels on one time axis, the legend entries used, the marks placed."""

    def __init__(self, t: Timeline) -> None:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        self.t = t
        lanes = lane_names(t)
        lanes_in = max(1.6, min(0.42, max(0.12, 9.0 / len(lanes))) * len(lanes))
        fig = plt.figure(figsize=(16, 4.2 + lanes_in + 2.0), dpi=100)
        grid = fig.add_gridspec(3, 1, height_ratios=[4.2, lanes_in, 1.6], hspace=0.32)
        self.ax_steps = fig.add_subplot(grid[0])
        self.ax_lanes = fig.add_subplot(grid[1], sharex=self.ax_steps)
        self.ax_good = fig.add_subplot(grid[2])
        self.drawing = Drawing(fig)
        self.scale, self.unit = time_scale(t.t1 - t.t0)
        self.lane_y = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}
        self.used: dict[str, Any] = {}  # legend entries, in order of use
        self.many = len(t.faults()) > FEW_FAULTS
        self.size = 6 if self.many else 9
        self._ids = iter(range(10**9))

    def x(self, when: float) -> float:
        return (when - self.t.t0) / self.scale

    def lane(self, node: int | None, default: str = JOB_LANE) -> str:
        return f"node {node}" if node is not None and f"node {node}" in self.lane_y else default

    def legend(self, key: str, handle: Any) -> None:
        self.used.setdefault(key, handle)

    def recoveries(self) -> None:
        """Behind everything: from the last step before each fault to the first after, in its class's colour."""
        from matplotlib.patches import Patch

        for span in self.t.spans:
            if span.kind.startswith("recovery_"):
                colour = FAULT_STYLE.get(span.kind.removeprefix("recovery_"), ("#999999", ""))[0]
                for ax in (self.ax_steps, self.ax_lanes):
                    ax.axvspan(self.x(span.start), self.x(span.end), color=colour, alpha=0.10, lw=0)
                label = "recovery: last step → first step after (fault's colour)"
                self.legend("recovery", Patch(color="#d62728", alpha=0.15, label=label))

    def steps(self) -> None:
        from matplotlib.lines import Line2D

        t, ax, x = self.t, self.ax_steps, self.x
        per_rank = 0 < len(t.rank_steps) <= FEW_RANKS
        widest = 1.5 + 2.5 * min(len(t.nodes) - 1, 3)  # lock-step nodes overlap: the first lines are widest
        for i, node in enumerate(t.nodes):
            colour = NODE_COLOURS[i % len(NODE_COLOURS)]
            width = max(1.5, widest - 2.5 * i)
            for seg in _by_attempt(t.steps.get(node, [])):  # no line across a restart: nothing ran there
                ax.plot([x(a) for a, _ in seg], [s for _, s in seg], "-o", ms=2.5, lw=width, color=colour, alpha=0.85)
            if t.steps.get(node):
                self.legend(
                    f"node {node}", Line2D([], [], color=colour, lw=2, label=f"node {node}: steps (all its ranks)")
                )
            for rank in sorted(t.rank_steps) if per_rank else []:
                if t.rank_nodes.get(rank) == node:
                    for seg in _by_attempt(t.rank_steps[rank]):
                        ax.plot([x(a) for a, _ in seg], [s for _, s in seg], "-", lw=0.7, alpha=0.5, color=colour)
        ax.set_ylabel("step (newest finished)")
        ax.grid(True, alpha=0.3)
        ax.set_title(title(t), fontsize=13, loc="left", fontweight="bold")
        thin = 0.4 if self.many else 1.0  # hundreds of restarts: hairlines, the steps stay visible
        for m in t.marks:
            if m.kind == "restart":
                ax.axvline(x(m.time), color="#d62728", ls="--", lw=0.9 * thin, alpha=0.7 * thin)
            elif m.kind == "membership":
                ax.axvline(x(m.time), color="#1f77b4", ls="-.", lw=thin, alpha=0.8 * thin)

    def spans(self) -> None:
        """Hangs, stragglers, silences: bars on their node's lane."""
        from matplotlib.patches import Patch

        for span in self.t.spans:
            if span.kind not in SPAN_STYLE:
                continue
            colour, legend = SPAN_STYLE[span.kind]
            hatch = "//" if span.kind == "hang" else None
            gid = f"ev{next(self._ids)}"
            width = self.x(span.end) - self.x(span.start)
            y = self.lane_y[self.lane(span.node)]
            self.ax_lanes.barh(
                y,
                width,
                left=self.x(span.start),
                height=0.5,
                color=colour,
                alpha=0.45,
                hatch=hatch,
                edgecolor=colour,
                gid=gid,
            )
            self.drawing.hover[gid] = _hover(span)
            self.legend(f"span {span.kind}", Patch(facecolor=colour, alpha=0.45, hatch=hatch, label=legend))

    def mark(self, m: Mark) -> None:
        from matplotlib.lines import Line2D

        if m.kind in FAULT_STYLE:
            colour, marker = FAULT_STYLE[m.kind]
            legend, lane, size, said = (
                CLASSES.get(m.kind, "machine loss (replication)"),
                self.lane(m.node),
                self.size + 2,
                True,
            )
        elif m.kind in OTHER_STYLE:
            colour, marker, legend = OTHER_STYLE[m.kind]
            lane = COMMIT_LANE if m.kind.startswith("commit_") else JOB_LANE
            if m.kind in ("straggler", "injected"):
                lane = self.lane(m.node)
            size, said = self.size + (3 if marker == "|" else 0), m.kind in ("membership", "resume")
        else:
            return
        self.put(m, lane, colour, marker, size)
        if said and not self.many:
            offset = (5, -11) if m.kind == "membership" else (6, 5)
            self.ax_lanes.annotate(
                m.label,
                (self.x(m.time), self.lane_y[lane]),
                xytext=offset,
                textcoords="offset points",
                fontsize=8,
                color=colour,
                clip_on=True,  # a label near the right edge stops at the panel, not in the legend
            )
        if m.kind == "resume" and not self.many:  # hundreds of triangles would bury the step lines
            step = _step_at(self.t, m.time)
            if step is not None:
                self.ax_steps.plot([self.x(m.time)], [step], marker=">", color=colour, ms=9, ls="none", zorder=6)
        mew = 2 if marker == "|" else 0.6
        self.legend(m.kind, Line2D([], [], color=colour, marker=marker, ls="none", ms=9, mew=mew, label=legend))

    def put(self, m: Mark, lane: str, colour: str, marker: str, size: float) -> None:
        gid = f"ev{next(self._ids)}"
        bar = marker == "|"
        self.ax_lanes.plot(
            [self.x(m.time)],
            [self.lane_y[lane]],
            marker=marker,
            color=colour,
            ms=size,
            mec=colour if bar else "white",
            mew=2 if bar else 0.6,
            ls="none",
            gid=gid,
            zorder=5,
        )
        self.drawing.hover[gid] = _hover(m)
        self.drawing.placed.append(Placed(gid, m.kind, m.node, self.x(m.time), self.lane_y[lane], m.label))

    def finish(self) -> Drawing:
        ax = self.ax_lanes
        ax.set_yticks(list(self.lane_y.values()), list(self.lane_y.keys()), fontsize=9)
        ax.set_ylim(-0.6, len(self.lane_y) - 0.4)
        for y in self.lane_y.values():
            ax.axhline(y, color="#dddddd", lw=0.6, zorder=0)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xlabel(f"time since the run started ({self.unit})")
        ax.set_xlim(0, self.x(self.t.t1) * 1.01)
        self.ax_steps.tick_params(labelbottom=True)
        _goodput_panel(self.ax_good, self.t)
        fig = self.drawing.figure
        fig.legend(handles=list(self.used.values()), loc="upper right", bbox_to_anchor=(0.995, 0.995), fontsize=8)
        fig.subplots_adjust(left=0.07, right=0.80, top=0.95, bottom=0.07)
        fig.canvas.draw()
        _to_pixels(self.drawing, ax, self.lane_y)
        return self.drawing


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
    """Where the wall time went, and what each fault class cost; in the time axis's unit."""
    g = t.goodput or {}
    wall = float(g.get("wall_s") or 0.0)
    scale, unit = time_scale(max(wall, t.t1 - t.t0))
    ax.set_yticks([1, 0], ["wall time", "lost to faults"], fontsize=9)
    ax.set_ylim(-0.6, 1.6)
    left, small = 0.0, []
    if wall > 0 and g.get("productive_s") is not None:
        for key, name, colour in GOODPUT_PARTS:
            value = float(g.get(key) or 0.0) / scale
            if value <= 0:
                continue
            ax.barh(1, value, left=left, color=colour, height=0.6, edgecolor="white")
            text = f"{name} {_amount(value, unit)} ({value * scale / wall * 100:.0f}%)"
            if value * scale / wall > 0.15:
                ax.text(left + value / 2, 1, text, ha="center", va="center", fontsize=8)
            else:  # too narrow to hold its words: said above the bar, in order
                small.append(text)
            left += value
        if small:
            ax.text(0.0, 1.36, " · ".join(small), transform=ax.get_yaxis_transform(), fontsize=8, va="bottom")
    else:
        words = "no rank reported progress: only the wall time is known"
        ax.text(0.01, 1, words, transform=ax.get_yaxis_transform(), va="center", fontsize=9)
    shift, said = 0.0, []
    names = {"sigkill": "kill -9", "node_left": "node left", "node_lost": "node lost", "node_joined": "node joined"}
    for cls, (count, seconds) in sorted(t.costs.items(), key=lambda kv: -kv[1][1]):
        colour = FAULT_STYLE.get(cls, ("#999999", ""))[0]
        ax.barh(0, seconds / scale, left=shift, color=colour, height=0.6, alpha=0.8, edgecolor="white")
        said.append(f"{names.get(cls, cls)} ×{count}: {_amount(seconds / scale, unit)}")
        shift += seconds / scale
    if said:  # between the two bars, from the left: never past the panel however long the losses
        ax.text(0.0, 0.5, "lost: " + " · ".join(said), transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.set_xlim(0, max(wall / scale, shift, 1e-3) * 1.01)
    ax.set_xlabel(
        f"{ {'s': 'seconds', 'min': 'minutes', 'h': 'hours'}[unit] } of the run (top: where the wall time went; "
        "bottom: time without steps after each fault class)"
    )
    ax.grid(True, axis="x", alpha=0.3)


def _amount(value: float, unit: str) -> str:
    return f"{value:.1f}s" if unit == "s" else f"{value:.1f} {unit}"


def _to_pixels(drawing: Drawing, ax: Any, lane_y: dict[str, int]) -> None:
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
