"""Which label each supervised process gets: its output prefix and its name in mlaunch's messages."""

from __future__ import annotations

from launchers.plan import LaunchPlan, process_label


def process_labels(plan: LaunchPlan) -> dict[int, str]:
    """Index in ``plan.processes`` → label: ``rank N``, or ``node K rank N`` when several nodes run here."""
    several = len(plan.nodes) > 1
    placed = [(node.index, proc) for node in plan.nodes for proc in node.processes]
    return {index: process_label(proc, node if several else None) for index, (node, proc) in enumerate(placed)}
