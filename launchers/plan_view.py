"""Human rendering of a LaunchPlan for ``mlaunch plan`` (rich when available).

Environment that is the same for every process is shown once; the table shows what
differs per process, so a 16-rank plan stays readable.
"""

from __future__ import annotations

import shlex

from launchers.plan import LaunchPlan, proc_title


def common_env(plan: LaunchPlan) -> dict[str, str]:
    procs = plan.processes
    if not procs:
        return {}
    first = procs[0].env
    return {k: v for k, v in first.items() if all(p.env.get(k) == v for p in procs[1:])}


def print_plan(plan: LaunchPlan) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency; plain text is the fallback
        print(plan.render_text())
        return
    console = Console(soft_wrap=False)
    console.print(f"[bold]{plan.headline()}[/bold]", highlight=False)
    for note in plan.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    shared = common_env(plan)
    table = Table(show_lines=False, expand=False)
    for column in ("node", "host", "process", "command", "env (per process)", "log"):
        table.add_column(column, overflow="fold")
    for node in plan.nodes:
        for step in node.bootstrap:
            table.add_row(str(node.index), node.host, "bootstrap", step.name, "", "")
        for proc in node.processes:
            own = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(proc.env.items()) if k not in shared)
            table.add_row(str(node.index), node.host, proc_title(proc), shlex.join(proc.argv), own, proc.log or "")
    console.print(table)
    if plan.processes:
        console.print(f"cwd: {plan.processes[0].cwd}", highlight=False)
    if shared:
        console.print("env (every process): " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(shared.items())),
                      highlight=False)
