"""The pure pieces of an MPI plan: hosts, ports, the job's ssh secret, and the command lines.

``launchers.engines.mpi`` puts them together into a plan: every node's ``keys``/``sshd``
steps, node 0's ``python -m bootstrap.head ... -- mpirun ...`` and the ``-x`` exports that
decide which variables reach the ranks (never a credential).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from bootstrap.runtime import NodeFiles, ssh_client_args
from launchers.config.job import Job
from launchers.config.secrets import looks_secret
from launchers.engines.base import base_env, entry_argv, script_args
from launchers.errors import UserError
from launchers.plan import BootstrapStep
from launchers.platform.cluster import Cluster

KEYS_ENV = "MLAUNCH_SSH_KEYS"  # where a platform mounts the job secret, when job.yaml names none

ALWAYS_EXPORT = ("PATH",)
EXPORT_IF_SET = ("LD_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS")
FLAVOUR_PREFIXES = {
    "openmpi": ("NCCL_",),
    "horovod": ("NCCL_", "HOROVOD_"),
    "mindspore-gpu": ("NCCL_", "GLOG_", "MS_"),
}
# Horovod's own mpirun line (horovod/runner/mpi_run.py) and the seed's: TCP/shared memory, no openib.
FLAVOUR_MCA = {
    "openmpi": [],
    "horovod": ["-mca", "pml", "ob1", "-mca", "btl", "^openib"],
    "mindspore-gpu": ["-mca", "pml", "ob1", "-mca", "btl", "^openib"],
}


def is_multi_node(cluster: Cluster) -> bool:
    return not cluster.simulated and cluster.nnodes > 1


def cluster_hosts(cluster: Cluster) -> list[str]:
    hosts = list(cluster.hosts)
    if len(hosts) != cluster.nnodes:
        raise UserError(
            f"the MPI engine needs every node's host name, got {len(hosts)} for {cluster.nnodes} nodes; expected "
            "VC_WORKER_HOSTS, MA_VJ_NAME, /etc/volcano/<task>.host or job.yaml mpi.hosts"
        )
    return hosts


def completion_port(job: Job) -> int:
    port = job.mpi.completion_port or job.mpi.sshd_port + 1
    if port > 65535 or port == job.mpi.sshd_port:
        raise UserError(f"mpi.completion_port {port} is not a free TCP port beside sshd_port {job.mpi.sshd_port}")
    return port


def ssh_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def keys_source(job: Job, env: Mapping[str, str]) -> Path:
    """The job secret directory: job.yaml ``mpi.keys_dir``, else ``$MLAUNCH_SSH_KEYS``; checked."""
    from bootstrap.keys import problems

    if job.mpi.keys_dir:
        path, origin = job.resolve(job.mpi.keys_dir), f"mpi.keys_dir in {job.source or 'job.yaml'}"
    elif env.get(KEYS_ENV, "").strip():
        path, origin = Path(env[KEYS_ENV].strip()), f"${KEYS_ENV}"
    else:
        raise UserError(
            "an MPI job across nodes needs the job's ssh secret on every node: create it once with "
            "`mlaunch keys DIR`, then set `mpi: {keys_dir: DIR}` in job.yaml or mount DIR and set "
            f"{KEYS_ENV}=DIR"
        )
    try:
        found = problems(path)
    except OSError as exc:  # a path the OS refuses outright (too long, a loop)
        found = [f"{path!s:.200} cannot be read ({exc.strerror or exc})"]
    if found:
        raise UserError(
            f"the job's ssh secret ({origin}) is not usable: {'; '.join(found)}. Create one with `mlaunch keys DIR`"
        )
    return path


def node_steps(job: Job, cluster: Cluster, layout: NodeFiles) -> list[BootstrapStep]:
    """Steps every node of a multi-node job takes: install the secret, start sshd."""
    source = keys_source(job, cluster.env)
    host = cluster_hosts(cluster)[cluster.node_rank]
    return [
        BootstrapStep("keys", {"from": str(source), "to": str(layout.dir), "mode": "0600 files in a 0700 directory"}),
        BootstrapStep(
            "sshd",
            {
                "port": job.mpi.sshd_port,
                "listen": host,
                "config": str(layout.sshd_config),
                "pid_file": str(layout.sshd_pid),
                "auth": "publickey only (job key), no password, no PAM",
            },
        ),
    ]


def head_prefix(job: Job, attempt: int, layout: NodeFiles, slots: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bootstrap.head",
        "--job",
        job.job_name,
        "--attempt",
        str(attempt),
        "--hostfile",
        str(layout.hostfile),
        "--slots",
        str(slots),
        # variables the runner adds after planning (MLAUNCH_CHECKPOINT_KEEP...) reach the ranks too
        "--export-prefix",
        "MLAUNCH_",
    ]


def export_names(job: Job, cluster: Cluster, attempt: int) -> list[str]:
    """Exactly the variables the ranks get through ``-x``, in a stable order; never a credential."""
    env = cluster.env
    names: list[str] = list(base_env(job, attempt))
    names += ALWAYS_EXPORT
    names += [name for name in EXPORT_IF_SET if name in env]
    prefixes = FLAVOUR_PREFIXES[job.mpi.flavour]
    names += sorted(n for n in env if n.startswith(prefixes) and not looks_secret(n))
    for pattern in job.mpi.export:
        if any(ch in pattern for ch in "*?["):
            names += sorted(n for n in env if fnmatch.fnmatchcase(n, pattern) and not looks_secret(n))
        else:
            names.append(pattern)
    return list(dict.fromkeys(names))


def mpirun_argv(job: Job, cluster: Cluster, attempt: int, layout: NodeFiles, *, local: bool) -> list[str]:
    opts = job.mpi
    argv = [shutil.which("mpirun") or "mpirun"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += [
        "-np",
        str(cluster.world_size),
        "-hostfile",
        str(layout.hostfile),
        "-wdir",
        str(job.code_path),
        "-bind-to",
        "none",
        "-map-by",
        "slot",
    ]
    if not local:
        argv += ["-mca", "plm_rsh_args", " ".join(ssh_client_args(layout, opts.sshd_port))]
        # Only node 0 holds the ssh options' files at these paths: no tree spawn from other nodes.
        argv += ["-mca", "plm_rsh_no_tree_spawn", "true"]
        if opts.interfaces:
            nics = ",".join(opts.interfaces)
            argv += ["-mca", "btl_tcp_if_include", nics, "-mca", "oob_tcp_if_include", nics]
    argv += FLAVOUR_MCA[opts.flavour]
    exports = export_names(job, cluster, attempt)
    for name in exports:
        argv += ["-x", name]
    if opts.interfaces and not local and "NCCL_SOCKET_IFNAME" not in exports:
        argv += ["-x", f"NCCL_SOCKET_IFNAME={','.join(opts.interfaces)}"]
    argv += [*opts.extra_args, *entry_argv(job), *script_args(job, cluster)]
    return argv
