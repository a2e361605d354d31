"""``mlaunch check``: everything that can be known before launch, explained.

Each check returns findings; an ``error`` finding makes the command exit 2. Checks that
belong to later parts (high availability, grace budget) add themselves to ``CHECKS``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from launchers.config.job import Job, load_job
from launchers.errors import EXIT_USER_ERROR, UserError
from launchers.findings import Finding
from launchers.plan import LaunchPlan

CheckFn = Callable[[Job, LaunchPlan], list[Finding]]


def _entry(job: Job, plan: LaunchPlan) -> list[Finding]:
    """The run path's own preflight (code_dir, start file, python, command lines, log/checkpoint dirs)."""
    from launchers.preflight import preflight_errors

    problems = preflight_errors(job, plan)
    if problems:
        return [Finding("error", problem) for problem in problems]
    return [Finding("ok", f"start file {job.entry_path} exists; python, code_dir, log and checkpoint dirs are usable")]


def _plan_summary(job: Job, plan: LaunchPlan) -> list[Finding]:
    found = [Finding("ok", plan.headline())]
    found += [Finding("note", note) for note in plan.notes]
    return found


def _high_availability(job: Job, plan: LaunchPlan) -> list[Finding]:
    """Replica groups of the HA layout (the refusals themselves are raised while planning)."""
    if not job.high_availability.enabled:
        return []
    from launchers.engines.high_availability import TASKD_ROLE, check_high_availability, describe_groups

    try:
        groups = check_high_availability(job, plan.world_size)
    except UserError as exc:
        return [Finding("error", str(exc))]
    found = [Finding("ok", describe_groups(job, groups))]
    for node in plan.nodes:
        for proc in node.processes:
            if proc.role == TASKD_ROLE:
                found.append(Finding("ok", f"TaskD manager on node {node.index}; LD_PRELOAD={proc.env['LD_PRELOAD']}"))
    return found


def _mpi(job: Job, plan: LaunchPlan) -> list[Finding]:
    """MPI jobs: mpirun (and for several nodes sshd, ssh and the job's ssh secret) are in place."""
    if plan.engine != "mpi":
        return []
    from launchers.engines.mpi import findings

    return [Finding(level, message) for level, message in findings(job, plan)]


def _prestart(job: Job, plan: LaunchPlan) -> list[Finding]:
    """The prestart: section: wheel patterns, secrets, wheels that match nothing yet."""
    from launchers.generate.prestart import check_prestart

    return check_prestart(job, plan)


def _grace_budget(job: Job, plan: LaunchPlan) -> list[Finding]:
    """Step + save time against the grace period; the kill timers of the chain agree; preload imports."""
    from launchers.persist.grace_budget import check

    return check(job, plan)


CHECKS: list[CheckFn] = [_plan_summary, _entry, _high_availability, _mpi, _prestart, _grace_budget]


def run_checks(job_file: Path, engine: str | None, extra_args: Sequence[str], *, simulate: bool = False) -> int:
    """Print every finding; return 0 when nothing is an error, else 2."""
    from launchers.planning import make_plan, resolve_engine_name

    job = load_job(job_file)
    print(f"ok: {job_file} is a valid job file")
    _, _, plan = make_plan(job, resolve_engine_name(job, engine), extra_args, simulate=simulate)
    worst = 0
    for check in CHECKS:
        for finding in check(job, plan):
            stream = sys.stderr if finding.level == "error" else sys.stdout
            print(f"{finding.level}: {finding.message}", file=stream)
            if finding.level == "error":
                worst = EXIT_USER_ERROR
    return worst
