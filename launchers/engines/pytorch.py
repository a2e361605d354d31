"""PyTorch engine: torchrun's per-process contract, ModelArts' ``--init_method`` style, or torchrun itself.

Styles (job.yaml ``pytorch.style``):
- ``env`` (default): every process gets what torchrun would give it — ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``NODE_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT`` and the ``TORCHELASTIC_*`` variables — so any
  torchrun-ready script runs unchanged.
- ``init_method``: the same env, plus ``--init_method tcp://MASTER:PORT --rank R
  --world_size W`` appended to the script's argv (global rank and world), for
  ModelArts-style DDP scripts that call ``init_process_group(init_method=...)``.
- ``torchrun``: one ``torchrun`` per node with c10d rendezvous, for users who want torch's
  elastic agent (node ranges such as ``2:3``, torchrun's own restarts).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from launchers.config.job import Job
from launchers.config.timers import timer_chain
from launchers.engines.base import (
    Cleanup,
    base_env,
    entry_argv,
    log_file,
    policy_of,
    restart_port,
    script_args,
)
from launchers.errors import UserError
from launchers.plan import LaunchPlan, NodePlan, ProcessSpec
from launchers.platform.cluster import PYTORCH_PLATFORM_ARGS, Cluster, detect


class PytorchEngine:
    name = "pytorch"

    def detect(self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], *, simulate: bool = False) -> Cluster:
        cluster = detect(job, env, extra_args, consumes=PYTORCH_PLATFORM_ARGS, simulate=simulate)
        if cluster.nnodes_spec and job.pytorch.style != "torchrun":
            raise UserError(
                f"the platform asks for an elastic node range ({cluster.nnodes_spec}); only torchrun's agent can "
                "run that — set `pytorch: {style: torchrun}` in job.yaml"
            )
        from launchers.platform.resize import check_node_range

        if check_node_range(job, cluster) is not None and cluster.simulated:
            cluster.notes.append(
                f"pytorch.nnodes {job.pytorch.nnodes}: a local simulation runs every node in this one mlaunch, "
                "so no node can leave or join; the elastic range takes effect with one mlaunch per node"
            )
        return cluster

    def restart_cluster(self, cluster: Cluster, attempt: int) -> Cluster:
        from dataclasses import replace

        return replace(cluster, master_port=restart_port(cluster, attempt))

    def plan(self, job: Job, cluster: Cluster, attempt: int = 0) -> LaunchPlan:
        if job.pytorch.style == "torchrun":
            return self._plan_torchrun(job, cluster, attempt)
        nproc = cluster.procs_per_node
        world = cluster.world_size
        nodes = []
        for node in cluster.local_nodes():
            procs = []
            for local in range(nproc):
                rank = node * nproc + local
                env = base_env(job, attempt)
                env.update(
                    {
                        "RANK": str(rank),
                        "LOCAL_RANK": str(local),
                        "WORLD_SIZE": str(world),
                        "LOCAL_WORLD_SIZE": str(nproc),
                        "GROUP_RANK": str(node),
                        "NODE_RANK": str(node),
                        "GROUP_WORLD_SIZE": str(cluster.nnodes),
                        "ROLE_RANK": str(rank),
                        "ROLE_WORLD_SIZE": str(world),
                        "ROLE_NAME": "default",
                        "MASTER_ADDR": cluster.master_addr,
                        "MASTER_PORT": str(cluster.master_port),
                        "TORCHELASTIC_RESTART_COUNT": str(attempt),
                        "TORCHELASTIC_MAX_RESTARTS": str(job.restart.max_restarts),
                        "TORCHELASTIC_RUN_ID": job.job_name,
                        "TORCHELASTIC_USE_AGENT_STORE": "False",
                    }
                )
                if nproc > 1 and "OMP_NUM_THREADS" not in job.env and "OMP_NUM_THREADS" not in cluster.env:
                    env["OMP_NUM_THREADS"] = "1"  # as torchrun does: N processes must not each take every core
                argv = [*entry_argv(job), *script_args(job, cluster)]
                if job.pytorch.style == "init_method":
                    argv += [
                        "--init_method",
                        f"tcp://{cluster.master_addr}:{cluster.master_port}",
                        "--rank",
                        str(rank),
                        "--world_size",
                        str(world),
                    ]
                procs.append(
                    ProcessSpec(
                        rank=rank,
                        local_rank=local,
                        argv=argv,
                        env=env,
                        cwd=str(job.code_path),
                        log=log_file(job, f"rank{rank}"),
                    )
                )
            nodes.append(NodePlan(index=node, host=cluster.host_of(node), processes=procs))
        return self._plan(job, cluster, attempt, nodes)

    def _plan_torchrun(self, job: Job, cluster: Cluster, attempt: int) -> LaunchPlan:
        opts = job.pytorch
        nnodes = opts.nnodes or cluster.nnodes_spec or str(cluster.nnodes)
        rdzv_id = opts.rdzv_id or f"{job.job_name}-{attempt}"
        nodes = []
        for node in cluster.local_nodes():
            argv = [
                job.python or sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nnodes}",
                f"--nproc-per-node={cluster.procs_per_node}",
                f"--rdzv-backend={opts.rdzv_backend}",
                f"--rdzv-endpoint={cluster.master_addr}:{cluster.master_port}",
                f"--rdzv-id={rdzv_id}",
                f"--max-restarts={opts.max_restarts or 0}",
                # torchrun's SIGTERM→SIGKILL timer must match mlaunch's grace period, or it
                # kills the workers before their dying checkpoint is written.
                f"--shutdown-timeout={timer_chain(job).torchrun_shutdown_timeout}",
            ]
            if ":" not in nnodes:
                argv.append(f"--node-rank={node}")
            if opts.rdzv_backend == "c10d":
                # Name the store's host explicitly: on one machine every simulated node resolves
                # to the endpoint, and across hosts hostname matching is unreliable.
                argv.append(f"--rdzv-conf=is_host={1 if node == 0 else 0}")
            if cluster.simulated:
                argv.append("--local-addr=127.0.0.1")
            argv += [str(job.entry_path), *script_args(job, cluster)]
            env = base_env(job, attempt)
            nodes.append(
                NodePlan(
                    index=node,
                    host=cluster.host_of(node),
                    processes=[
                        ProcessSpec(
                            rank=-1,
                            local_rank=-1,
                            argv=argv,
                            env=env,
                            cwd=str(job.code_path),
                            log=log_file(job, f"node{node}-torchrun"),
                            role="torchrun",
                            label=f"node {node} torchrun",
                        )
                    ],
                )
            )
        return self._plan(job, cluster, attempt, nodes)

    def _plan(self, job: Job, cluster: Cluster, attempt: int, nodes: list[NodePlan]) -> LaunchPlan:
        return LaunchPlan.for_cluster(self.name, cluster, nodes, policy=policy_of(job), attempt=attempt)

    def prepare(self, job: Job, plan: LaunchPlan) -> Cleanup | None:
        """Nothing to set up: torch's processes (and torchrun) need no node-level work."""
        return None


ENGINE = PytorchEngine()
