"""Slurm's env inside an allocation: node count, this node's index, the hosts, one mlaunch per node.

mlaunch runs **once per node** under Slurm (``srun --ntasks-per-node=1 mlaunch ...``, what
``mlaunch sbatch`` writes) and starts that node's processes itself, so Slurm's *tasks* are
mlaunch instances, not training processes. What is read (measured with slurmd 22.05):

- ``SLURM_JOB_ID`` (or ``SLURM_JOBID``) makes it a Slurm sighting at all;
- the hosts: ``SLURM_STEP_NODELIST`` inside an ``srun`` step, else ``SLURM_JOB_NODELIST``
  (``SLURM_NODELIST``), in Slurm's compressed form (``node[01-04,07]``, ``a[1-2],b3``,
  ``n[001-003]-ib``) expanded by python-hostlist (the maintained library Slurm sites use;
  ``pip install 'mlaunch[slurm]'``), else by Slurm's own ``scontrol show hostnames`` (python-hostlist
  ships no wheel, and a platform's offline wheelhouse must not need it); the first host is the master;
- the node count: ``SLURM_STEP_NUM_NODES`` in a step, else ``SLURM_NNODES``
  (``SLURM_JOB_NUM_NODES``); it must equal the number of hosts;
- this node's index: ``SLURM_NODEID``; ``SLURM_PROCID`` (the task's rank) must equal it and
  ``SLURMD_NODENAME`` must be the host at that index, or mlaunch was started more than once
  per node;
- ``SLURM_NTASKS_PER_NODE`` / ``SLURM_STEP_NUM_TASKS`` in a step: tasks (= mlaunch instances)
  per node, which must be 1 — they are *not* the training processes per node (in the batch
  script they describe the allocation, and the script runs mlaunch once);
- processes per node: ``SLURM_GPUS_ON_NODE`` when > 0 (one process per GPU, as with
  ``MA_NUM_GPUS``), else job.yaml's ``procs_per_node``. ``SLURM_CPUS_ON_NODE`` is never a
  process count: a CPU-only node with 64 cores would otherwise start 64 ranks; cores are the
  data loaders' business.

Several nodes seen from the batch script itself (no ``SLURM_STEP_ID``) is an error: only node 0
would run, and it would wait for the others forever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from launchers.config.limits import MAX_NODES, MAX_PROCS_PER_NODE
from launchers.errors import PlatformError
from launchers.platform.sighting import Sighting, env_int

MAX_NODELIST_CHARS = 1024 * 1024  # a compressed node list longer than this is not Slurm's
_ONE_PER_NODE = "start mlaunch once per node: `srun --ntasks-per-node=1 mlaunch ...` (what `mlaunch sbatch` writes)"


def from_slurm_env(env: Mapping[str, str]) -> Sighting | None:
    """The Slurm sighting (``SLURM_JOB_ID`` present), or None."""
    job_var = next((name for name in ("SLURM_JOB_ID", "SLURM_JOBID") if name in env), None)
    if job_var is None:
        return None
    env_int(env, job_var, meaning="Slurm's job id")
    in_step = "SLURM_STEP_ID" in env
    s = Sighting("slurm")
    list_var, hosts = _hosts(env, in_step)
    count_var = _first_present(env, ("SLURM_STEP_NUM_NODES",) if in_step else ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"))
    nnodes = len(hosts)
    if count_var is not None:
        nnodes = env_int(env, count_var, minimum=1, maximum=MAX_NODES, meaning="the number of nodes") or 0
        if nnodes != len(hosts):
            raise PlatformError(
                f"Slurm env {count_var}={nnodes} but {list_var}={env[list_var]!r} names {len(hosts)} "
                f"host{'s' if len(hosts) != 1 else ''}; expected one host per node"
            )
    s.put("nnodes", nnodes, f"{count_var or list_var}={env.get(count_var or list_var, '')}")
    s.put("hosts", hosts, f"{list_var}={env[list_var]}")
    s.put("master_addr", hosts[0], f"first host of {list_var} {hosts[0]}")
    if nnodes > 1 and not in_step:
        raise PlatformError(
            f"Slurm runs {nnodes} nodes ({list_var}={env[list_var]}), but this is the batch script itself "
            f"(no SLURM_STEP_ID): only node 0 would start; {_ONE_PER_NODE}"
        )
    _node_index(s, env, hosts, in_step)
    gpus = env_int(env, "SLURM_GPUS_ON_NODE", maximum=MAX_PROCS_PER_NODE, meaning="GPUs allocated on this node")
    if gpus:
        s.put("nproc", gpus, f"SLURM_GPUS_ON_NODE={gpus}")
    return s


def _first_present(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in env), None)


def _hosts(env: Mapping[str, str], in_step: bool) -> tuple[str, list[str]]:
    """(the variable read, the expanded host names)."""
    names = ("SLURM_STEP_NODELIST",) if in_step else ()
    list_var = _first_present(env, (*names, "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    if list_var is None:
        raise PlatformError(
            "Slurm env has SLURM_JOB_ID but no node list; expected SLURM_JOB_NODELIST (or "
            "SLURM_STEP_NODELIST inside srun), e.g. node[01-04]"
        )
    return list_var, expand_nodelist(env[list_var], list_var)


def expand_nodelist(text: str, what: str) -> list[str]:
    """Slurm's compressed host list → host names, in Slurm's order; bounded before it is expanded."""
    spec = text.strip()
    if not spec:
        raise PlatformError(f"Slurm env {what} is empty; expected host names such as node[01-04,07]")
    if len(spec) > MAX_NODELIST_CHARS:
        raise PlatformError(f"Slurm env {what} is longer than {MAX_NODELIST_CHARS:,} characters")
    count = _count_hosts(spec)
    if count > MAX_NODES:
        raise PlatformError(f"Slurm env {what}={spec[:80]!r} names {count:,} hosts; mlaunch runs at most {MAX_NODES:,}")
    hosts = _expand(spec, what)
    if not hosts or any(not h or h != h.strip() for h in hosts):
        raise PlatformError(f"Slurm env {what}={spec[:200]!r} has an empty or blank host name")
    if len(set(hosts)) != len(hosts):
        twice = next(h for h in hosts if hosts.count(h) > 1)
        raise PlatformError(f"Slurm env {what}={spec[:200]!r} names host {twice} twice; expected each node once")
    return hosts


def _expand(spec: str, what: str) -> list[str]:
    try:
        import hostlist  # python-hostlist
    except ImportError:
        return _scontrol_hostnames(spec, what)
    try:
        return [str(h) for h in hostlist.expand_hostlist(spec, allow_duplicates=True)]
    except hostlist.BadHostlist as exc:
        raise PlatformError(
            f"Slurm env {what}={spec[:200]!r} is not a Slurm host list ({exc}); "
            "expected e.g. node[01-04,07] or a1,b[2-3]"
        ) from None


def _scontrol_hostnames(spec: str, what: str) -> list[str]:
    """Slurm's own expansion, where python-hostlist is not installed (scontrol is on every Slurm node)."""
    import shutil
    import subprocess

    exe = shutil.which("scontrol")
    if exe is None:
        raise PlatformError(
            f"cannot expand Slurm env {what}={spec[:80]!r}: neither python-hostlist "
            "(pip install 'mlaunch[slurm]') nor Slurm's scontrol is available"
        )
    try:
        done = subprocess.run([exe, "show", "hostnames", spec], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PlatformError(f"cannot expand Slurm env {what} with {exe}: {exc}") from None
    if done.returncode != 0:
        # scontrol's own words go after mlaunch's sentence, not inside it: they run over several lines
        # (a node without slurm.conf says four), and they may be about scontrol rather than the list.
        said = "\n".join(f"    {line}" for line in (done.stderr or done.stdout).strip().splitlines()[:8])
        raise PlatformError(
            f"cannot expand Slurm env {what}={spec[:200]!r}: python-hostlist is not installed (pip install "
            f"'mlaunch[slurm]'), and `scontrol show hostnames` exited {done.returncode}; expected a host list "
            f"such as node[01-04,07] or a1,b[2-3]. scontrol said:\n{said or '    (nothing)'}"
        )
    return done.stdout.split()


def _count_hosts(spec: str) -> int:
    """How many names a host list expands to, computed from its ranges (so ``n[0-999999999]`` is never built)."""
    total, product = 0, 1
    for token in re.finditer(r"\[([^\[\]]*)\]|(,)|[^\[\],]+|(.)", spec):
        if token.group(3):  # a lone bracket: let the library say what is wrong
            return 0
        if token.group(2):
            total, product = total + product, 1
        elif token.group(1) is not None:
            size = 0
            for part in token.group(1).split(","):
                bounds = part.split("-")
                if len(bounds) == 2 and all(re.fullmatch(r"[0-9]{1,12}", b) for b in bounds):
                    size += max(int(bounds[1]) - int(bounds[0]) + 1, 1)
                else:
                    size += 1
            product *= size
            if product > MAX_NODES:  # already too many: stop before the numbers grow
                return product
    return total + product


def _node_index(s: Sighting, env: Mapping[str, str], hosts: list[str], in_step: bool) -> None:
    """``SLURM_NODEID``, checked against ``SLURM_PROCID``, ``SLURMD_NODENAME`` and the tasks per node."""
    tasks_var = "SLURM_STEP_NUM_TASKS" if in_step and "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    tasks = env_int(env, tasks_var, minimum=1, meaning="the number of Slurm tasks") if in_step else None
    # In the batch script these describe the allocation, not how often mlaunch runs (once: the script).
    per_node = env_int(env, "SLURM_NTASKS_PER_NODE", minimum=1, meaning="Slurm tasks per node") if in_step else None
    if per_node is not None and per_node > 1:
        raise PlatformError(f"Slurm env SLURM_NTASKS_PER_NODE={per_node}: {per_node} mlaunch per node; {_ONE_PER_NODE}")
    if tasks is not None and tasks != len(hosts):
        raise PlatformError(
            f"Slurm env {tasks_var}={tasks} tasks on {len(hosts)} nodes: mlaunch would start more than once on a "
            f"node; {_ONE_PER_NODE}"
        )
    node = env_int(env, "SLURM_NODEID", meaning="this node's index in the allocation, from 0")
    if node is None:
        return
    s.put("node_rank", node, f"SLURM_NODEID={node}")
    proc = env_int(env, "SLURM_PROCID", meaning="the Slurm task's rank, from 0")
    if proc is not None and proc != node:
        raise PlatformError(
            f"Slurm env SLURM_PROCID={proc} differs from SLURM_NODEID={node}: several tasks per node; {_ONE_PER_NODE}"
        )
    name = env.get("SLURMD_NODENAME", "").strip()
    if name and node < len(hosts) and name != hosts[node]:
        raise PlatformError(
            f"Slurm env SLURMD_NODENAME={name} but SLURM_NODEID={node} is {hosts[node]} in the node list; "
            "the node list and this node's index do not agree"
        )
