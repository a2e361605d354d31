"""MPI engine: Open MPI's mpirun over the job's own sshd, with Horovod and MindSpore-GPU flavours.

What ModelArts' ``run_mpi.sh`` does by hand, as a plan (``mlaunch plan`` shows every step):

- **every node** copies the job secret (``mlaunch keys DIR``) into a private runtime
  directory and starts a key-only sshd on ``mpi.sshd_port`` (36666), host key pinned;
- **node 0** runs one process, ``python -m bootstrap.head -- mpirun ...``: it checks every
  host's sshd concurrently with a real SSH login, writes the hostfile (``host slots=N``) and
  runs mpirun (which starts every rank on every node through ssh);
- **the other nodes** run one process, ``python -m bootstrap.peer``, which holds the node (its
  sshd) until its mlaunch stops it. The job's control plane (``launchers.control``, on
  ``mpi.completion_port``, its key derived from the job's ssh secret too) carries the rest:
  node 0's mlaunch tells every node the job's exit code and each exits with it; a failure
  restarts every node together; a node 0 that vanishes is lost after ``monitor.node_timeout``
  (or the older ``mpi.node0_timeout``), and the peers exit non-zero (no ``sleep 365d``).

With no platform env (or a single node) the job runs on this machine: one mpirun on
localhost with nodes × procs_per_node slots, no sshd, so an MPI job can be tried on a laptop.

mpirun gets ``-x`` for exactly the variables the job needs — mlaunch's per-job variables,
job.yaml's ``env``, ``PATH``, ``LD_LIBRARY_PATH``, ``PYTHONPATH``, ``NCCL_*`` (plus
``HOROVOD_*`` / ``GLOG_*``, ``MS_*`` for the flavours) and the names or globs listed in
``mpi.export`` — and never a credential: secret-looking names are refused or skipped.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from bootstrap.runtime import CLIENT_KEY, NodeFiles, node_files_for
from launchers.config.job import Job
from launchers.engines.base import Cleanup, base_env, log_file, policy_of
from launchers.engines.mpi_commands import (
    cluster_hosts,
    completion_port,
    head_prefix,
    is_multi_node,
    keys_source,
    mpirun_argv,
    node_steps,
    ssh_user,
)
from launchers.errors import UserError
from launchers.plan import BootstrapStep, LaunchPlan, NodePlan, ProcessSpec
from launchers.platform.cluster import Cluster, detect

VOLCANO_DIR_ENV = "MLAUNCH_VOLCANO_DIR"  # the Volcano svc plugin's ConfigMap (default /etc/volcano)


class MpiEngine:
    name = "mpi"

    # -- detect ----------------------------------------------------------------------------
    def detect(self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], *, simulate: bool = False) -> Cluster:
        notes: list[str] = []
        if not simulate:
            env = self._with_fallback_hosts(job, env, notes)
        # ModelArts appends nothing to an MPI start file: every extra argument is the script's.
        cluster = detect(job, env, extra_args, consumes=(), default_port=job.mpi.sshd_port, simulate=simulate)
        cluster = replace(cluster, notes=[*cluster.notes, *notes])
        if not cluster.simulated:
            cluster = replace(cluster, master_port=job.mpi.sshd_port)
        if is_multi_node(cluster):
            keys = keys_source(job, cluster.env)  # a missing or broken secret stops here, before anything starts
            cluster = replace(cluster, control_port=completion_port(job), control_key=str(keys / CLIENT_KEY))
        return cluster

    @staticmethod
    def _with_fallback_hosts(job: Job, env: Mapping[str, str], notes: list[str]) -> Mapping[str, str]:
        """Hosts from /etc/volcano/<task>.host, then job.yaml, when the platform env names none."""
        from bootstrap.hosts import VOLCANO_DIR, env_with_hosts, volcano_hosts

        named = env.get("VC_WORKER_HOSTS", "").strip() or (
            env.get("MA_VJ_NAME", "").strip() and env.get("MA_NUM_HOSTS", "").strip()
        )
        if named:  # the platform names the hosts itself (launchers.platform.cluster reads them)
            return env
        on_platform = any(
            env.get(name, "").strip() for name in ("MA_NUM_HOSTS", "VC_TASK_INDEX", "VK_TASK_INDEX", "MA_TASK_INDEX")
        )
        if not on_platform:
            return env
        task = env.get("MA_TASK_NAME", "").strip() or "worker"
        directory = Path(env.get(VOLCANO_DIR_ENV) or VOLCANO_DIR)
        hosts = volcano_hosts(task, directory)
        if hosts:
            notes.append(f"hosts from {directory}/{task}.host (Volcano svc plugin): {', '.join(hosts)}")
            return env_with_hosts(env, hosts)
        if job.mpi.hosts:
            notes.append(f"hosts from job.yaml mpi.hosts: {', '.join(job.mpi.hosts)}")
            return env_with_hosts(env, job.mpi.hosts)
        return env

    def restart_cluster(self, cluster: Cluster, attempt: int) -> Cluster:
        """Same hosts and ports: sshd and the control plane's port are fixed for the job."""
        return cluster

    # -- plan ------------------------------------------------------------------------------
    def plan(self, job: Job, cluster: Cluster, attempt: int = 0) -> LaunchPlan:
        if not is_multi_node(cluster):
            node = self._local_node(job, cluster, attempt)
        elif cluster.node_rank == 0:
            node = self._head_node(job, cluster, attempt)
        else:
            node = self._peer_node(job, cluster, attempt)
        notes = []
        if cluster.simulated and job.mpi.interfaces:
            notes.append(f"local simulation: mpi.interfaces ({', '.join(job.mpi.interfaces)}) not used on one machine")
        if cluster.simulated and cluster.nnodes > 1:
            notes.append(
                f"local simulation: {cluster.nnodes} nodes × {cluster.procs_per_node} slots as one mpirun on localhost"
            )
        return LaunchPlan.for_cluster(self.name, cluster, [node], policy=policy_of(job), attempt=attempt, notes=notes)

    def _layout(self, job: Job, cluster: Cluster) -> NodeFiles:
        return node_files_for(job.job_name, str(job.source or job.base_dir), cluster.node_rank, cluster.env)

    def _local_node(self, job: Job, cluster: Cluster, attempt: int) -> NodePlan:
        layout = self._layout(job, cluster)
        slots = cluster.world_size
        mpirun = mpirun_argv(job, cluster, attempt, layout, local=True)
        head = [
            *head_prefix(job, attempt, layout, slots),
            "--local",
            "--grace",
            f"{job.checkpoint.grace_period:g}",
            "--",
            *mpirun,
        ]
        steps = [
            BootstrapStep("runtime_dir", {"path": str(layout.dir)}),
            BootstrapStep("hostfile", {"path": str(layout.hostfile), "hosts": ["localhost"], "slots": slots}),
        ]
        return NodePlan(0, cluster.host_of(0), [self._head_process(job, attempt, head)], steps)

    def _head_node(self, job: Job, cluster: Cluster, attempt: int) -> NodePlan:
        opts = job.mpi
        layout = self._layout(job, cluster)
        hosts = cluster_hosts(cluster)
        mpirun = mpirun_argv(job, cluster, attempt, layout, local=False)
        head = [
            *head_prefix(job, attempt, layout, cluster.procs_per_node),
            "--hosts",
            ",".join(hosts),
            "--ssh-port",
            str(opts.sshd_port),
            "--user",
            ssh_user(),
            "--key-file",
            str(layout.client_key),
            "--known-hosts",
            str(layout.known_hosts),
            "--peer-timeout",
            f"{opts.peer_timeout:g}",
            "--grace",
            f"{job.checkpoint.grace_period:g}",
            "--",
            *mpirun,
        ]
        steps = [
            *node_steps(job, cluster, layout),
            BootstrapStep(
                "wait_for_peers",
                {
                    "hosts": hosts,
                    "port": opts.sshd_port,
                    "timeout": opts.peer_timeout,
                    "check": "concurrent ssh login with the job key, host key pinned",
                },
            ),
            BootstrapStep("hostfile", {"path": str(layout.hostfile), "hosts": hosts, "slots": cluster.procs_per_node}),
            # node 0's control plane (launchers.control) tells the peers the exit code, on this port
            BootstrapStep("completion", {"role": "notify", "port": completion_port(job), "peers": hosts[1:]}),
        ]
        return NodePlan(0, hosts[0], [self._head_process(job, attempt, head)], steps)

    def _peer_node(self, job: Job, cluster: Cluster, attempt: int) -> NodePlan:
        layout = self._layout(job, cluster)
        hosts = cluster_hosts(cluster)
        node = cluster.node_rank
        argv = [sys.executable, "-m", "bootstrap.peer", "--node0", hosts[0], "--runtime-dir", str(layout.dir)]
        steps = [
            *node_steps(job, cluster, layout),
            BootstrapStep("completion", {"role": "wait", "port": completion_port(job), "node0": hosts[0]}),
        ]
        proc = ProcessSpec(
            rank=-1,
            local_rank=-1,
            argv=argv,
            env=base_env(job, attempt),
            cwd=str(job.code_path),
            log=log_file(job, f"node{node}-peer"),
            role="peer",
            label=f"node {node} peer",
        )
        return NodePlan(node, hosts[node], [proc], steps)

    def _head_process(self, job: Job, attempt: int, argv: list[str]) -> ProcessSpec:
        return ProcessSpec(
            rank=-1,
            local_rank=-1,
            argv=argv,
            env=base_env(job, attempt),
            cwd=str(job.code_path),
            log=log_file(job, "node0-mpirun"),
            role="mpirun",
            label="node 0 mpirun",
        )

    # -- prepare (node-level side effects, before the attempt's processes start) -------------
    def prepare(self, job: Job, plan: LaunchPlan) -> Cleanup | None:
        from bootstrap import keys, sshd

        node = plan.nodes[0]
        steps = {step.name: step.params for step in node.bootstrap}
        if "keys" not in steps:  # one machine: only the hostfile's directory is needed
            layout_dir = Path(steps["runtime_dir"]["path"])
            keys.make_private_dir(layout_dir)
            return lambda: shutil.rmtree(layout_dir, ignore_errors=True)
        layout = NodeFiles(Path(steps["keys"]["to"]))
        try:
            keys.install(Path(steps["keys"]["from"]), layout)
        except OSError as exc:
            raise UserError(f"cannot install the job's ssh secret into {layout.dir}: {exc}") from None
        params = steps["sshd"]
        try:
            sshd.start(layout, int(params["port"]), sshd.listen_addresses(str(params["listen"])))
        except (sshd.SshdError, OSError) as exc:
            keys.remove_secrets(layout)
            raise UserError(f"cannot start sshd for the job on port {params['port']}: {exc}") from None

        def cleanup() -> None:
            sshd.stop(layout)
            keys.remove_secrets(layout)
            shutil.rmtree(layout.dir, ignore_errors=True)

        return cleanup


Level = Literal["ok", "note", "warning", "error"]


def findings(job: Job, plan: LaunchPlan) -> list[tuple[Level, str]]:
    """``mlaunch check`` for MPI jobs: (level, message) pairs."""
    from bootstrap.sshd import sshd_binary

    out: list[tuple[Level, str]] = []
    mpirun = shutil.which("mpirun")
    if mpirun:
        out.append(("ok", f"mpirun found at {mpirun}"))
    else:
        out.append(("error", "mpirun is not installed (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev)"))
    multi = any(step.name == "sshd" for node in plan.nodes for step in node.bootstrap)
    if multi:
        from bootstrap.keys import loose_permissions

        binary = sshd_binary()
        out.append(("ok", f"sshd found at {binary}") if binary else ("error", "sshd is not installed (openssh-server)"))
        if shutil.which("ssh") is None:
            out.append(("error", "ssh is not installed (openssh-client); mpirun starts remote ranks with it"))
        for node in plan.nodes:
            for step in node.bootstrap:
                if step.name == "keys":
                    source = Path(step.params["from"])
                    out.append(("ok", f"job ssh secret {source} is complete"))
                    loose = loose_permissions(source)
                    if loose:
                        out.append(
                            (
                                "warning",
                                "readable by others: " + ", ".join(map(str, loose)) + " (mlaunch copies them to 0600 "
                                "files at run time; keep the secret itself private too)",
                            )
                        )
    return out


ENGINE = MpiEngine()
