"""What a supervised process is called: its output prefix and its name in mlaunch's messages."""

from __future__ import annotations

from launchers.plan import LaunchPlan, ProcessSpec


def process_label(proc: ProcessSpec, node: int | None = None) -> str:
    """The process's own label, else ``rank N`` (a worker) or ``<role> N``; ``node K …`` first when given."""
    base = proc.label or (f"rank {proc.rank}" if proc.role == "worker" else f"{proc.role} {proc.rank}")
    if node is not None and not base.startswith("node "):
        base = f"node {node} {base}"
    return base


def process_labels(plan: LaunchPlan) -> dict[int, str]:
    """Index in ``plan.processes`` → label: ``rank N``, or ``node K rank N`` when several nodes run here."""
    several = len(plan.nodes) > 1
    placed = [(node.index, proc) for node in plan.nodes for proc in node.processes]
    return {index: process_label(proc, node if several else None) for index, (node, proc) in enumerate(placed)}
