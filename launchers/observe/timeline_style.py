"""How the timeline looks: colours and markers per fault class and mark, the time unit, the title (pure).

``timeline_draw`` paints with these; the tests read the same colours back from the PNG.
"""

from __future__ import annotations

from launchers.observe.timeline_model import Timeline

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
    "warning": ("#ff9896", "*", "warning (recomputed, started over, in-place fallback)"),
    "in_place": ("#2ca02c", "o", "recovered in place (survivors kept their processes)"),
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


def lane_names(t: Timeline) -> list[str]:
    return [JOB_LANE, COMMIT_LANE, *(f"node {n}" for n in t.nodes)]
