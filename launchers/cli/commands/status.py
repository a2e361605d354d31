"""``mlaunch status``: the job as its mlaunch last saw it — per node and rank: step, rate, checkpoint, flags.

Reads ``<log_dir>/status.json``: node 0's mlaunch (and a local simulation's) keeps the whole
job's view there; on another node the file holds that node's ranks, and the command asks the
node's running mlaunch to bring node 0's whole view first (``launchers.observe.status_relay``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

STALE_AFTER = 10.0  # seconds without an update before the view says mlaunch may not be running


def status(
    job_file: Annotated[
        Path | None, typer.Argument(help="the job.yaml file (default: ./job.yaml)", show_default=False)
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the status file's JSON, for machines")] = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh in place until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.2, help="seconds between refreshes")] = 1.0,
) -> None:
    """Show a running (or the last) job: per node and rank its step, steps/s, last progress, restarts, last committed checkpoint, straggler and hang flags.

    mlaunch status job.yaml            mlaunch status job.yaml --watch            mlaunch status --json
    """  # noqa: E501 - one line per paragraph: the help renderer re-wraps it
    from launchers.config.job import load_job
    from launchers.errors import UserError
    from launchers.observe.status_file import STATUS_FILE

    path = job_file if job_file is not None else Path("job.yaml")
    if job_file is None and not path.exists():
        raise UserError("no job.yaml here: give the job file, e.g. `mlaunch status path/to/job.yaml`")
    job = load_job(path)
    status_path = Path(job.resolve(job.log_dir)) / STATUS_FILE
    if as_json:
        typer.echo(json.dumps(_load(status_path), indent=1))
        return
    if not watch:
        _console().print(render(_load(status_path), status_path))
        return
    from rich.live import Live

    with Live(render(_load(status_path), status_path), console=_console(), auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render(_load(status_path), status_path), refresh=True)
        except KeyboardInterrupt:
            pass


def _load(path: Path) -> dict[str, Any]:
    from launchers.errors import UserError
    from launchers.observe.status_file import read_status
    from launchers.observe.status_relay import ask

    ask(path.parent, path)  # another node's file holds its own ranks: its mlaunch brings node 0's whole view
    try:
        return read_status(path)
    except FileNotFoundError:
        raise UserError(f"no status yet: {path} does not exist (has this job been run with this log_dir?)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


def render(data: dict[str, Any], path: Path) -> Any:
    """A rich renderable: a header line and one table row per rank."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    age = time.time() - float(data.get("updated") or 0)
    phase = str(data.get("phase", "?"))
    stale = f" — no update for {age:.0f}s: is mlaunch still running?" if age > STALE_AFTER and phase in _LIVE else ""
    committed = data.get("last_committed_step")
    head = Text(
        f"{data.get('job', '?')}: {phase}, attempt {data.get('attempt', 0)}, restarts {data.get('restarts', 0)}, "
        f"last committed step {committed if committed is not None else '-'}{stale}"
    )
    partial = partial_line(data) if not stale else None
    if partial:
        head.append(f"\n{partial}", style="bold")
    hang = hang_line(data)
    if hang:
        head.append(f"\n{hang}", style="bold")
    members = membership_line(data)
    if members:
        head.append(f"\n{members}")
    for warning in data.get("recompute_warnings") or []:
        head.append(f"\nwarning: {warning}", style="bold")
    over = data.get("started_over")
    if isinstance(over, dict):
        head.append(
            f"\nWARNING: attempt {over.get('attempt', '?')} trained from scratch although step "
            f"{over.get('committed_step', '?')} is committed (checkpoint.on_unreadable: start_over)",
            style="bold",
        )
    plane = control_plane_line(data)
    if plane:
        head.append(f"\n{plane}", style="bold" if "public facts" in plane else "")
    replicas = replica_line(data)
    if replicas:
        head.append(f"\n{replicas}")
    table = Table(box=None, pad_edge=False)
    for column in ("node", "host", "rank", "step", "steps/s", "last progress", "committed", "flags"):
        table.add_column(column, justify="right" if column in ("node", "rank", "step", "steps/s") else "left")
    for node in data.get("nodes", []):
        for r in node.get("ranks", []):
            flags = [f for f in ("straggler", "hung") if r.get(f)]
            if r.get("started_over_from") is not None:
                flags.append(f"started over (step {r['started_over_from']} committed)")
            if r.get("hung") and r.get("in_collective"):
                flags[-1] = "hung (in a collective)"
            table.add_row(
                str(node.get("index", "?")),
                str(node.get("host", "")),
                str(r.get("rank", "?")),
                _or_dash(r.get("step")),
                f"{r['steps_per_s']:.2f}" if isinstance(r.get("steps_per_s"), (int, float)) else "-",
                _ago(r.get("last_progress")),
                _or_dash(r.get("committed_step")),
                ", ".join(flags),
            )
    return Group(head, table, Text(f"({path})", style="dim"))


_LIVE = {"starting", "running", "restarting"}


def partial_line(data: dict[str, Any]) -> str | None:
    """Another node's view when node 0's whole one did not come in time (``status_relay``): said, not silent."""
    from launchers.observe.status_relay import ANSWER_WAIT

    if data.get("scope") != "node":
        return None
    return f"this node's ranks only: node 0's whole view did not come within {ANSWER_WAIT:.0f}s (asked each time)"


MAX_NAMED = 16  # ranks named on the hang line; a job of thousands says how many more


def membership_line(data: dict[str, Any]) -> str | None:
    """An elastic job's newest membership change (``pytorch.nnodes: "MIN:MAX"``): who left, who joined, the sizes."""
    change = data.get("membership")
    if not isinstance(change, dict):
        return None
    left = ", ".join(_node(x) + (f": {x['why']}" if x.get("why") else "") for x in change.get("left") or [])
    joined = ", ".join(_node(x) for x in change.get("joined") or [])
    line = (
        f"membership at attempt {change.get('attempt', '?')}: {change.get('nodes_before', '?')} → "
        f"{change.get('nodes_after', '?')} nodes ({change.get('world_before', '?')} → {change.get('world_after', '?')} "
        f"ranks); nodes in the job: {', '.join(map(str, change.get('members') or [])) or '-'}"
    )
    if left:
        line += f"; left: {left}"
    if joined:
        line += f"; joined: {joined}"
    if change.get("regroup"):
        line += f"; regrouped: {change['regroup']}"
    return line


def replica_line(data: dict[str, Any]) -> str | None:
    """Machine-loss replication (``checkpoint.replicate``): each node's newest step streamed to its buddy."""
    nodes = [n for n in data.get("nodes", []) if "replicated_step" in n]
    if not nodes:
        return None
    parts = [f"node {n.get('index', '?')}: {_replica(n)}" for n in nodes[:MAX_NAMED]]
    more = f" (+{len(nodes) - MAX_NAMED} nodes)" if len(nodes) > MAX_NAMED else ""
    held = sum(int(n.get("replica_bytes") or 0) for n in nodes) / len(nodes) / 1e6
    copies = f"{held:.1f} MB of a neighbour's slots held per node"
    return f"machine-loss replication, newest step a buddy holds: {', '.join(parts)}{more}; {copies}"


def control_plane_line(data: dict[str, Any]) -> str | None:
    """Node 0's control plane: what strangers sent or tried, dropped and counted; a key anyone could derive."""
    plane = data.get("control_plane")
    if not isinstance(plane, dict):
        return None
    parts = []
    if plane.get("keyed_from_public_facts"):
        parts.append("keyed from public facts (set MLAUNCH_JOB_SECRET)")
    if not plane.get("encrypted"):
        parts.append("not encrypted (this libzmq has no CURVE)")
    dropped = sum(int(plane.get(why) or 0) for why in ("unverified", "malformed", "replayed"))
    refused = int(plane.get("handshake_failed") or 0) + int(plane.get("closed_unauthenticated") or 0)
    if dropped:
        parts.append(
            f"dropped {dropped} messages ({plane.get('unverified', 0)} did not verify, "
            f"{plane.get('malformed', 0)} malformed, {plane.get('replayed', 0)} replayed)"
        )
    if refused:
        parts.append(
            f"refused {refused} connections ({plane.get('handshake_failed', 0)} failed the handshake, "
            f"{plane.get('closed_unauthenticated', 0)} closed before authenticating"
            + (f", {plane['over_cap']} cut over the cap of {plane.get('cap')}" if plane.get("over_cap") else "")
            + ")"
        )
    if plane.get("pending"):
        parts.append(f"{plane['pending']} not authenticated yet")
    return f"control plane: {'; '.join(parts)}" if parts else None


def _replica(node: dict[str, Any]) -> str:
    if node.get("replica") == "replicated state":
        return "replicated state (no copy needed)"
    if node.get("replica") == "none":
        return "no buddy (a job of one node)"
    behind = node.get("replica_behind")
    lag = f" ({behind} steps behind: a loss would cost about {behind} steps)" if node.get("replica_at_risk") else ""
    refused = node.get("replica_refused")
    tampered = f"; refused {refused} slots whose digest did not match" if refused else ""
    return f"step {_or_dash(node.get('replicated_step'))}{lag}{tampered}"


def _node(entry: dict[str, Any]) -> str:
    return f"node {entry.get('node')}" + (f" ({entry['host']})" if entry.get("host") else "")


def hang_line(data: dict[str, Any]) -> str | None:
    """The hung ranks outside any collective wait first (where they are stuck), then the ones waiting for them."""
    hung = [(n.get("index", "?"), r) for n in data.get("nodes", []) for r in n.get("ranks", []) if r.get("hung")]
    if not hung:
        return None
    outside = [(node, r) for node, r in hung if not r.get("in_collective")]
    waiting = [r.get("rank", "?") for _, r in hung if r.get("in_collective")]
    parts = []
    if outside:
        named = [
            f"rank {r.get('rank', '?')} (node {node}" + (f", at {r['hang_frame']})" if r.get("hang_frame") else ")")
            for node, r in outside
        ]
        parts.append("hung outside any collective wait: " + _some(named))
    if waiting:
        parts.append("waiting in a collective: " + _some([f"rank {rank}" for rank in waiting]))
    return "; ".join(parts)


def _some(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(names[:MAX_NAMED]) + more


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _ago(wall: Any) -> str:
    if not isinstance(wall, (int, float)) or wall <= 0:
        return "-"
    return f"{max(0.0, time.time() - wall):.1f}s ago"


def register(app: typer.Typer) -> None:
    app.command(name="status")(status)
