"""Human rendering of a LaunchPlan for ``mlaunch plan``.

Environment that is the same for every process is shown once; each process shows only
what differs, so a 16-rank plan stays readable. Colour (rich) only on a terminal; piped
output is plain text that greps well.
"""

from __future__ import annotations

import shlex
import sys

from launchers.plan import LaunchPlan, proc_title


def common_env(plan: LaunchPlan) -> dict[str, str]:
    procs = plan.processes
    if not procs:
        return {}
    first = procs[0].env
    return {k: v for k, v in first.items() if all(p.env.get(k) == v for p in procs[1:])}


def _env_text(env: dict[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))


def plan_lines(plan: LaunchPlan) -> list[tuple[str, str]]:
    """(style, text) lines; style is a rich style name or ''."""
    shared = common_env(plan)
    cwds = {p.cwd for p in plan.processes}
    lines: list[tuple[str, str]] = [("bold", plan.headline())]
    lines += [("yellow", f"note: {note}") for note in plan.notes]
    if plan.control_port:
        lines.append(("", f"control plane: {plan.master_addr}:{plan.control_port} (node 0 hosts it, every node joins)"))
    for node in plan.nodes:
        lines.append(("bold cyan", f"node {node.index}  host {node.host}"))
        for step in node.bootstrap:
            lines.append(("", f"  bootstrap: {step.name}"))
        for proc in node.processes:
            own = {k: v for k, v in proc.env.items() if k not in shared}
            lines.append(("green", f"  {proc_title(proc)}  {_env_text(own)}".rstrip()))
            lines.append(("", f"      $ {shlex.join(proc.argv)}"))
            if len(cwds) > 1:
                lines.append(("dim", f"      cwd: {proc.cwd}"))
            if proc.log:
                lines.append(("dim", f"      log: {proc.log}"))
    if len(cwds) == 1:
        lines.append(("", f"cwd (every process): {next(iter(cwds))}"))
    if shared:
        lines.append(("", f"env (every process): {_env_text(shared)}"))
    return lines


def print_plan(plan: LaunchPlan) -> None:
    lines = plan_lines(plan)
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.text import Text

        console = Console()
        for style, text in lines:
            console.print(Text(text, style=style or ""))
        return
    sys.stdout.write("".join(text + "\n" for _, text in lines))
