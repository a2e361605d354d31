"""TensorFlow engine: ps/worker (and chief) tasks, told their place by flags and/or ``TF_CONFIG``.

Where the cluster comes from (``launchers/platform/tf_cluster.py`` reads and cross-checks them):
- the platform names every task (ModelArts' appended ``--ps_hosts/--worker_hosts/--task_index/
  --job_name`` or ``--task_name``, ``TF_CONFIG``, Volcano's ``VC_PS_HOSTS``/``VC_WORKER_HOSTS``):
  this container *is* one task, and mlaunch starts exactly that one process;
- the platform names only nodes (``MA_NUM_HOSTS``/``VC_WORKER_HOSTS``, no ps list): mlaunch places
  ``tensorflow.ps`` parameter servers beside each node's workers, as ModelArts does, on
  ``tensorflow.port`` and the ports after it;
- nothing: local simulation, every task on 127.0.0.1 with free ports.

What each process gets (``tensorflow.output``): the classic flags appended to its argv, and/or
``TF_CONFIG`` (``cluster``, ``task``, and whatever extra keys the platform's ``TF_CONFIG`` had).
Parameter servers see no accelerator (``CUDA_VISIBLE_DEVICES=""``). They never exit on their
own, so they are service processes (``required=False``): the job's outcome is decided by the
chief when there is one (ParameterServerStrategy, whose workers also serve forever) and by the
workers otherwise (``tensorflow.decides`` overrides this); the supervisor stops the rest once
those have exited 0, and the job exits 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from launchers.address import address_host, join_host_port, split_host_port
from launchers.config.job import Job
from launchers.config.limits import MAX_WORLD_SIZE
from launchers.engines.base import Cleanup, base_env, entry_argv, log_file, policy_of, script_args
from launchers.errors import PlatformError
from launchers.plan import LaunchPlan, NodePlan, ProcessSpec
from launchers.platform.cluster import LOOPBACK, Cluster, detect, free_port, split_platform_args
from launchers.platform.tf_cluster import (
    TF_PLATFORM_ARGS,
    TfSighting,
    from_flags,
    from_tf_config,
    from_volcano_env,
    merge,
    resolve_task,
)


@dataclass
class TfTask:
    """One TensorFlow server: its role, index in that role, address, and where it runs."""

    type: str
    index: int
    node: int
    local: int  # position among this node's processes


@dataclass
class TensorflowCluster(Cluster):
    tf_cluster: dict[str, list[str]] = field(default_factory=dict)  # role → ["host:port", ...]
    tasks: list[TfTask] = field(default_factory=list)  # the tasks this machine runs
    extras: dict[str, object] = field(default_factory=dict)  # extra TF_CONFIG keys from the platform
    role_flag: str | None = None  # the flag the platform used for the role
    placed_by_mlaunch: bool = True  # mlaunch placed the tasks (and chose their ports), rather than the platform

    @property
    def world_size(self) -> int:
        return len(self.tf_cluster.get("chief", [])) + len(self.tf_cluster.get("worker", []))


def place_tasks(job: Job, nnodes: int, procs: int, hosts: list[str], ports: list[int]) -> tuple[dict, list[TfTask]]:
    """ModelArts' placement: per node ``procs`` workers then ``tensorflow.ps`` ps; worker 0 may become the chief.

    ``ports`` has one entry per task in that order (node by node).
    """
    opts = job.tensorflow
    workers: list[str] = []
    ps: list[str] = []
    tasks: list[TfTask] = []
    it = iter(ports)
    for node in range(nnodes):
        for local in range(procs):
            tasks.append(TfTask("worker", len(workers), node, local))
            workers.append(join_host_port(hosts[node], next(it)))
        for j in range(opts.ps):
            tasks.append(TfTask("ps", len(ps), node, procs + j))
            ps.append(join_host_port(hosts[node], next(it)))
    cluster: dict[str, list[str]] = {}
    if opts.chief:
        cluster["chief"] = workers[:1]
        workers = workers[1:]
        for t in tasks:
            if t.type == "worker":
                if t.index == 0:
                    t.type = "chief"
                else:
                    t.index -= 1
    if workers:
        cluster["worker"] = workers
    if ps:
        cluster["ps"] = ps
    return cluster, tasks


MAX_SIMULATED_TASKS = 4096  # a simulation binds one free loopback port per task


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports, in a bounded number of tries (else a PlatformError)."""
    if count > MAX_SIMULATED_TASKS:
        raise PlatformError(
            f"a simulated TensorFlow job of {count} tasks needs as many free ports on {LOOPBACK}; "
            f"simulation runs at most {MAX_SIMULATED_TASKS} tasks (lower nodes, procs_per_node or tensorflow.ps)"
        )
    ports: dict[int, None] = {}
    for _ in range(4 * count + 64):
        if len(ports) == count:
            break
        ports[free_port()] = None
    if len(ports) == count:
        return list(ports)
    raise PlatformError(f"could not find {count} distinct free ports on {LOOPBACK}; too many ports in use")


def _check_runnable(cluster: Mapping[str, list[str]], task_type: str, source: str) -> None:
    """A cluster mlaunch can run: a worker or chief, this task one of chief/worker/ps, a bounded size."""
    if task_type == "evaluator":
        raise PlatformError(
            f"this task is an evaluator ({source}); mlaunch runs chief, worker and ps tasks — start the "
            "evaluator's own script directly, outside the training cluster"
        )
    if not cluster.get("worker") and not cluster.get("chief"):
        raise PlatformError(
            f"{source} lists no worker or chief tasks ({', '.join(sorted(cluster)) or 'nothing'}); "
            "a TensorFlow cluster needs at least one worker"
        )
    total = sum(len(hosts) for hosts in cluster.values())
    if total > MAX_WORLD_SIZE:
        raise PlatformError(f"{source} lists {total} tasks; mlaunch runs at most {MAX_WORLD_SIZE}")


class TensorflowEngine:
    name = "tensorflow"

    def detect(
        self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], *, simulate: bool = False
    ) -> TensorflowCluster:
        args, rest = split_platform_args(extra_args, TF_PLATFORM_ARGS)
        if simulate and args:
            raise PlatformError(
                f"--simulate cannot be combined with platform arguments ({', '.join('--' + a for a in args)})"
            )
        sightings: list[TfSighting] = []
        if not simulate:
            found = [
                from_flags(args, env),
                from_tf_config(env),
                from_volcano_env(env, job.tensorflow.port),
            ]
            sightings = [s for s in found if s is not None]
        if sightings:
            return self._platform_task(job, env, rest, sightings)
        base = detect(job, env, rest, consumes=(), simulate=simulate)
        procs = base.procs_per_node
        per_node = procs + job.tensorflow.ps
        if base.simulated:
            hosts = [LOOPBACK] * base.nnodes
            ports = _free_ports(base.nnodes * per_node)
        else:
            hosts = [base.host_of(n) for n in range(base.nnodes)]
            if job.tensorflow.port + per_node - 1 > 65535:
                raise PlatformError(f"tensorflow.port {job.tensorflow.port} leaves no room for {per_node} servers")
            ports = [job.tensorflow.port + k for _ in range(base.nnodes) for k in range(per_node)]
        cluster, tasks = place_tasks(job, base.nnodes, procs, hosts, ports)
        mine = [t for t in tasks if t.node in base.local_nodes()]
        master_addr, master_port = split_host_port((cluster.get("chief") or cluster["worker"])[0], "chief/worker 0")
        return TensorflowCluster(
            **{f: getattr(base, f) for f in Cluster.__dataclass_fields__ if f not in ("master_addr", "master_port")},
            master_addr=master_addr,
            master_port=master_port,
            tf_cluster=cluster,
            tasks=mine,
        )

    def _platform_task(
        self, job: Job, env: Mapping[str, str], rest: list[str], sightings: list[TfSighting]
    ) -> TensorflowCluster:
        merged = merge(sightings)
        task_type, index = resolve_task(merged, env)
        _check_runnable(merged.cluster, task_type, merged.source)
        first = (merged.cluster.get("chief") or merged.cluster.get("worker") or [""])[0]
        host, port = split_host_port(first, "chief/worker 0", default_port=job.tensorflow.port) if first else ("", 0)
        all_hosts = [h for role in ("chief", "worker", "ps") for h in merged.cluster.get(role, [])]
        notes = []
        if merged.cluster.get("ps") is not None and job.tensorflow.ps not in (1, len(merged.cluster["ps"])):
            notes.append(
                f"job.yaml asks for tensorflow.ps: {job.tensorflow.ps}, the platform runs "
                f"{len(merged.cluster['ps'])} ps tasks; following the platform"
            )
        return TensorflowCluster(
            source="+".join(s.source for s in sightings),
            simulated=False,
            nnodes=len(all_hosts),
            node_rank=all_hosts.index(merged.cluster[task_type][index]),
            procs_per_node=1,
            master_addr=host,
            master_port=port or job.tensorflow.port,
            hosts=[address_host(address) for address in all_hosts],
            extra_args=rest,
            notes=notes,
            env=dict(env),
            tf_cluster=merged.cluster,
            tasks=[TfTask(task_type, index, all_hosts.index(merged.cluster[task_type][index]), 0)],
            extras=merged.extras,
            role_flag=merged.role_flag,
            placed_by_mlaunch=False,
        )

    def restart_cluster(self, cluster: Cluster, attempt: int) -> Cluster:
        """Simulated: fresh ports (the old ones may linger in TIME_WAIT); a platform's addresses stay."""
        if not (isinstance(cluster, TensorflowCluster) and cluster.simulated):
            return cluster
        ports = iter(_free_ports(sum(len(v) for v in cluster.tf_cluster.values())))
        fresh = {
            role: [join_host_port(address_host(h), next(ports)) for h in hosts]
            for role, hosts in cluster.tf_cluster.items()
        }
        first = (fresh.get("chief") or fresh["worker"])[0]
        return replace(cluster, tf_cluster=fresh, master_port=split_host_port(first, "chief/worker 0")[1])

    # -- planning --------------------------------------------------------------------------
    def deciding_roles(self, job: Job, cluster: TensorflowCluster) -> set[str]:
        decides = job.tensorflow.decides
        if decides == "auto":
            decides = "chief" if cluster.tf_cluster.get("chief") else "workers"
        return {"chief"} if decides == "chief" else {"chief", "worker"}

    def plan(self, job: Job, cluster: Cluster, attempt: int = 0) -> LaunchPlan:
        if not isinstance(cluster, TensorflowCluster):
            raise TypeError("the tensorflow engine plans from the cluster its own detect() returned")
        opts = job.tensorflow
        flag = opts.role_flag if opts.role_flag != "auto" else (cluster.role_flag or "job_name")
        deciding = self.deciding_roles(job, cluster)
        if job.tensorflow.decides == "chief" and not cluster.tf_cluster.get("chief"):
            raise PlatformError("tensorflow.decides: chief, but the cluster has no chief; set chief: true")
        spec = cluster.tf_cluster
        base = [*entry_argv(job), *script_args(job, cluster)]
        by_node: dict[int, list[ProcessSpec]] = {n: [] for n in cluster.local_nodes()}
        # Services first: workers connect to parameter servers that are already listening.
        for task in sorted(cluster.tasks, key=lambda t: (t.node, t.type != "ps", t.local)):
            env = base_env(job, attempt)
            argv = list(base)
            if opts.output in ("flags", "both"):
                if spec.get("ps"):
                    argv += ["--ps_hosts", ",".join(spec["ps"])]
                argv += ["--worker_hosts", ",".join(spec.get("worker", []))]
                argv += [f"--{flag}", task.type, "--task_index", str(task.index)]
            if opts.output in ("tf_config", "both"):
                config = {"cluster": spec, "task": {"type": task.type, "index": task.index}, **cluster.extras}
                env["TF_CONFIG"] = json.dumps(config, separators=(",", ":"))
            if task.type == "ps":
                env["CUDA_VISIBLE_DEVICES"] = ""  # as on ModelArts: a ps gets CPU and memory only
            by_node.setdefault(task.node, []).append(
                ProcessSpec(
                    rank=task.index,
                    local_rank=task.local,
                    argv=argv,
                    env=env,
                    cwd=str(job.code_path),
                    log=log_file(job, f"{task.type}{task.index}"),
                    role=task.type,
                    required=task.type in deciding,
                    label=f"{task.type} {task.index}",
                )
            )
        nodes = [NodePlan(index=n, host=cluster.host_of(n), processes=procs) for n, procs in by_node.items()]
        return LaunchPlan.for_cluster(self.name, cluster, nodes, policy=policy_of(job), attempt=attempt)

    def prepare(self, job: Job, plan: LaunchPlan) -> Cleanup | None:
        """Nothing to set up: every TensorFlow server is one of the plan's processes."""
        return None


ENGINE = TensorflowEngine()
