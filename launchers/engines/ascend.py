"""Ascend engine: one process per device from a rank table, or MindSpore's dynamic cluster (msrun).

Styles (job.yaml ``ascend.style``):

- ``rank_table`` (default): read ``RANK_TABLE_FILE`` (v1.0, v1.2 or legacy ``group_list``; see
  ``launchers/platform/ranktable.py``), find this server, and start one process per device with
  ``RANK_TABLE_FILE``, ``RANK_ID``, ``RANK_SIZE``, ``DEVICE_ID``, ``ASCEND_DEVICE_ID``,
  ``RANK_START``, ``JOB_ID`` and its own working/log directory — what ModelArts' davincirun and
  the MindSpore ``run_distribute_train.sh`` loops do by hand. When ModelArts runs the start
  file once per device (``ASCEND_DEVICE_ID``/``RANK_ID`` already set), each copy starts just
  its own rank; node-level work belongs to the copy with ``ASCEND_DEVICE_ID=0``
  (``launchers/platform/ascend_device.py``). A legacy table is converted to 1.0 for the processes.
- ``msrun``: a scheduler (``MS_ROLE=MS_SCHED``) on node 0 plus ``MS_WORKER`` processes with
  ``MS_SCHED_HOST``/``MS_SCHED_PORT``/``MS_WORKER_NUM``/``MS_NODE_ID``/``RANK_ID``/``RANK_SIZE``,
  exactly what ``msrun`` exports. Chosen by job.yaml, or by ``MA_RUN_METHOD=msrun`` or
  MindCluster's ``MS_*`` env when job.yaml does not say. The scheduler exits by itself once the
  workers finish and reports a lost worker in its exit code, so it is a *required* process.

Local simulation (no platform input): nodes × procs_per_node; rank-table style writes a
generated version-1.0 table under ``log_dir/rank_table/`` in ``prepare`` (``plan`` stays pure
and already shows the path).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from launchers.config.job import Job
from launchers.engines.base import base_env, entry_argv, log_file, policy_of, restart_port, script_args
from launchers.errors import PlatformError
from launchers.plan import BootstrapStep, LaunchPlan, NodePlan, ProcessSpec
from launchers.platform.ascend_device import NODE_LEADER_ENV, per_device_start
from launchers.platform.cluster import (
    LOOPBACK,
    Cluster,
    detect,
    env_int,
    free_port,
    local_cluster,
    normalise_vj_name,
    split_platform_args,
)
from launchers.platform.ranktable import (
    RankTable,
    Server,
    find_this_server,
    gc_paused,
    generate_rank_table,
    load_rank_table,
    parse_rank_table,
    read_rank_table_json,
    write_rank_table,
)

WRITE_TABLE_STEP = "write_rank_table"
HCCL_CONNECT_TIMEOUT = "1800"  # davincirun's value when unset (HCCL's own default, 120 s, is short at scale)


@dataclass
class AscendCluster(Cluster):
    """The cluster as the Ascend engine sees it: the rank table, or the msrun layout."""

    style: str = "rank_table"
    table: RankTable | None = None
    table_file: str = ""  # what processes get as RANK_TABLE_FILE
    table_step: BootstrapStep | None = None  # how prepare() writes table_file (simulated / converted)
    only_rank: int | None = None  # ModelArts per-device start: this copy runs just this rank
    job_id: str = ""
    run_scheduler: bool = False  # msrun: this node runs the MS_SCHED process
    run_workers: bool = True  # msrun: this node runs workers (a MindCluster scheduler pod may not)
    server_found_by: str = ""
    notes_extra: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        if self.table is not None:
            return self.table.rank_size
        return self.nnodes * self.procs_per_node


def _say(message: str) -> None:
    sys.stderr.write(f"mlaunch: {message}\n")
    sys.stderr.flush()


def job_id_of(job: Job, env: Mapping[str, str]) -> str:
    """davincirun's JOB_ID: MA_VJ_NAME with ma-job → modelarts-job; else the job's name."""
    vj = env.get("MA_VJ_NAME", "").strip()
    return normalise_vj_name(vj) if vj else job.job_name


def rank_table_dir(job: Job) -> Path:
    return job.log_path / "rank_table"


class AscendEngine:
    name = "ascend"

    # -- detection -------------------------------------------------------------------------
    def detect(
        self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], *, simulate: bool = False
    ) -> AscendCluster:
        style = self.choose_style(job, {} if simulate else env)
        if style == "msrun":
            return self._detect_msrun(job, env, extra_args, simulate)
        return self._detect_rank_table(job, env, extra_args, simulate)

    @staticmethod
    def choose_style(job: Job, env: Mapping[str, str]) -> str:
        """job.yaml's ``ascend.style`` when set; else ``MA_RUN_METHOD`` / MindCluster ``MS_*`` env."""
        method = env.get("MA_RUN_METHOD", "").strip().lower()
        if method not in ("", "msrun", "torchrun", "rank_table"):
            raise PlatformError(f"platform env MA_RUN_METHOD={method!r}: expected msrun or torchrun (or unset)")
        if method == "torchrun":
            raise PlatformError(
                "platform env MA_RUN_METHOD=torchrun asks for torchrun; run it with `--engine pytorch` "
                "(pytorch: {style: torchrun}) instead of the ascend engine"
            )
        explicit = "style" in job.ascend.model_fields_set
        if explicit:
            if method == "msrun" and job.ascend.style != "msrun":
                raise PlatformError(
                    f"job.yaml says ascend.style: {job.ascend.style} but the platform env says MA_RUN_METHOD=msrun; "
                    "make them agree"
                )
            return job.ascend.style
        mindcluster_ms = bool(env.get("MS_SCHED_HOST", "").strip()) and not env.get("RANK_TABLE_FILE")
        return "msrun" if method == "msrun" or mindcluster_ms else "rank_table"

    def _table_path(self, job: Job, env: Mapping[str, str]) -> tuple[Path | None, str]:
        from_env = env.get("RANK_TABLE_FILE", "").strip()
        from_job = str(job.resolve(job.ascend.rank_table)) if job.ascend.rank_table else ""
        if from_env and from_job and Path(from_env).resolve() != Path(from_job):
            raise PlatformError(
                f"job.yaml says ascend.rank_table: {job.ascend.rank_table} ({from_job}) but the platform env says "
                f"RANK_TABLE_FILE={from_env}; remove one or make them name the same file"
            )
        ready = env.get("RANK_TABLE_FILE_V_1_0", "").strip()
        if ready:  # davincirun's already-converted 1.0 copy of a legacy table
            return Path(ready), "RANK_TABLE_FILE_V_1_0"
        if from_env:
            return Path(from_env), "RANK_TABLE_FILE"
        if from_job:
            return Path(from_job), "ascend.rank_table"
        return None, ""

    def _detect_rank_table(
        self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], simulate: bool
    ) -> AscendCluster:
        _, rest = split_platform_args(extra_args, ())
        path, origin = (None, "") if simulate else self._table_path(job, env)
        job_id = job_id_of(job, {} if simulate else env)
        if path is None:
            return self._simulated_table(job, env, rest, job_id)
        table = load_rank_table(path, wait_timeout=job.ascend.wait_timeout, on_wait=_say)
        notes: list[str] = []
        started = per_device_start(env)
        only_rank = None
        if started is not None:
            device, rank = started
            held = table.server_of_rank(rank)
            if held is None:
                raise PlatformError(
                    f"platform env RANK_ID={rank} is not in rank table {path} (ranks 0..{table.rank_size - 1})"
                )
            server, local = held
            if local != device:
                raise PlatformError(
                    f"platform env ASCEND_DEVICE_ID={device} but RANK_ID={rank} is device #{local} "
                    f"(device_id {server.devices[local].device_id}) of server {server.server_id!r} in {path}; "
                    "they must name the same device"
                )
            current = env.get("MA_CURRENT_HOST_IP", "").strip()
            if current and current not in server.names():
                raise PlatformError(
                    f"platform env MA_CURRENT_HOST_IP={current} but RANK_ID={rank} belongs to server "
                    f"{server.server_id!r} in {path}; they must agree"
                )
            found_by = f"RANK_ID={rank} (ModelArts per-device start)"
            only_rank = rank
            notes.append(
                f"ModelArts per-device start (ASCEND_DEVICE_ID={device}, RANK_ID={rank}): this copy runs rank "
                f"{rank} only; node-level work is done by the copy with ASCEND_DEVICE_ID=0"
            )
        else:
            server, found_by = find_this_server(table, env)
        self._cross_check(table, server, env, path)
        table_file = str(path)
        step = None
        if table.source_format == "legacy":
            table_file = str(rank_table_dir(job) / "hccl_v1.0.json")
            step = BootstrapStep(WRITE_TABLE_STEP, {"path": table_file, "convert_from": str(path)})
            notes.append(f"legacy group_list rank table {path} is converted to version 1.0 at {table_file}")
        hosts = [s.host_ip or s.server_id for s in table.servers]
        return AscendCluster(
            source=f"rank-table ({origin})",
            simulated=False,
            nnodes=len(table.servers),
            node_rank=server.index,
            procs_per_node=len(server.devices),
            master_addr=hosts[0],
            master_port=0,
            hosts=hosts,
            extra_args=rest,
            notes=notes,
            env=dict(env),
            style="rank_table",
            table=table,
            table_file=table_file,
            table_step=step,
            only_rank=only_rank,
            job_id=job_id,
            server_found_by=found_by,
        )

    @staticmethod
    def _cross_check(table: RankTable, server: Server, env: Mapping[str, str], path: Path) -> None:
        """Platform env that restates the table's shape must agree with it."""
        size = env_int(env, "RANK_SIZE", minimum=1, meaning="the number of devices in the job")
        if size is not None and size != table.rank_size:
            raise PlatformError(
                f"platform env RANK_SIZE={size} but rank table {path} lists {table.rank_size} devices; they must agree"
            )
        hosts = env_int(env, "MA_NUM_HOSTS", minimum=1, meaning="the number of nodes")
        if hosts is not None and hosts != len(table.servers):
            raise PlatformError(
                f"platform env MA_NUM_HOSTS={hosts} but rank table {path} lists {len(table.servers)} servers; "
                "they must agree"
            )

    def _simulated_table(self, job: Job, env: Mapping[str, str], rest: list[str], job_id: str) -> AscendCluster:
        nodes, devices = job.nodes, job.procs_per_node
        table = parse_rank_table(generate_rank_table(nodes, devices), "simulated rank table")
        table_file = str(rank_table_dir(job) / f"hccl_{nodes}s_{nodes * devices}p.json")
        base = local_cluster(job, rest, env)
        return AscendCluster(
            **{f: getattr(base, f) for f in Cluster.__dataclass_fields__ if f != "master_port"},
            master_port=0,  # HCCL has no rendezvous port
            style="rank_table",
            table=table,
            table_file=table_file,
            table_step=BootstrapStep(WRITE_TABLE_STEP, {"path": table_file, "servers": nodes, "devices": devices}),
            job_id=job_id,
            server_found_by="local simulation",
        )

    def _detect_msrun(
        self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], simulate: bool
    ) -> AscendCluster:
        explicit_port = "sched_port" in job.ascend.model_fields_set
        job_id = job_id_of(job, {} if simulate else env)
        if not simulate and env.get("MS_SCHED_HOST", "").strip():
            return self._detect_mindcluster(job, env, extra_args, job_id)
        base = detect(job, env, extra_args, consumes=(), simulate=simulate)
        if base.simulated:
            port = job.ascend.sched_port if explicit_port else free_port()
            return AscendCluster(
                **{f: getattr(base, f) for f in Cluster.__dataclass_fields__ if f != "master_port"},
                master_port=port,
                style="msrun",
                run_scheduler=True,
                job_id=job_id,
            )
        sched_host, note = resolve_sched_host(base.master_addr)
        return AscendCluster(
            **{f: getattr(base, f) for f in Cluster.__dataclass_fields__ if f not in ("master_port", "master_addr")},
            master_addr=sched_host,
            master_port=job.ascend.sched_port,
            style="msrun",
            run_scheduler=base.node_rank == 0,
            job_id=job_id,
            notes_extra=[note] if note else [],
        )

    def _detect_mindcluster(
        self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], job_id: str
    ) -> AscendCluster:
        """MindCluster env: MS_SCHED_HOST/PORT, MS_ROLE, MS_NODE_RANK, MS_WORKER_NUM, MS_LOCAL_WORKER."""
        _, rest = split_platform_args(extra_args, ())
        host = env["MS_SCHED_HOST"].strip()
        port = env_int(env, "MS_SCHED_PORT", minimum=1, meaning="the scheduler's TCP port")
        if port is None or port > 65535:
            raise PlatformError(
                f"platform env MS_SCHED_PORT={env.get('MS_SCHED_PORT')!r}: expected a TCP port 1..65535"
            )
        world = env_int(env, "MS_WORKER_NUM", minimum=1, meaning="the total number of workers")
        if world is None:
            raise PlatformError("platform env MS_SCHED_HOST is set but MS_WORKER_NUM is not; expected both")
        local = env_int(env, "MS_LOCAL_WORKER", minimum=1, meaning="workers on this node")
        local = local if local is not None else (job.procs_per_node if job.procs_per_node > 1 else world)
        if world % local:
            raise PlatformError(
                f"platform env MS_WORKER_NUM={world} is not a multiple of MS_LOCAL_WORKER={local} (workers per node)"
            )
        nnodes = world // local
        role = env.get("MS_ROLE", "").strip()
        if role not in ("", "MS_SCHED", "MS_WORKER"):
            raise PlatformError(f"platform env MS_ROLE={role!r}: expected MS_SCHED or MS_WORKER")
        node_rank = env_int(env, "MS_NODE_RANK", meaning="this node's index among worker nodes")
        if node_rank is None:
            if nnodes > 1:
                raise PlatformError(
                    f"platform env says {nnodes} nodes (MS_WORKER_NUM={world} / {local} per node) but not which one "
                    "this is; expected MS_NODE_RANK"
                )
            node_rank = 0
        if node_rank >= nnodes:
            raise PlatformError(
                f"platform env MS_NODE_RANK={node_rank} is outside 0..{nnodes - 1} for MS_WORKER_NUM={world} "
                f"with MS_LOCAL_WORKER={local}"
            )
        hosts = env_int(env, "MA_NUM_HOSTS", minimum=1, meaning="the number of nodes")
        if hosts is not None and hosts != nnodes:
            raise PlatformError(
                f"platform env MA_NUM_HOSTS={hosts} but MS_WORKER_NUM={world} / MS_LOCAL_WORKER={local} "
                f"gives {nnodes} nodes; they must agree"
            )
        scheduler = role == "MS_SCHED"
        # A scheduler pod without NPUs (NPU_POD=false) runs the scheduler only.
        workers = not (scheduler and env.get("NPU_POD", "").strip().lower() == "false")
        return AscendCluster(
            source="mindcluster-msrun",
            simulated=False,
            nnodes=nnodes,
            node_rank=node_rank,
            procs_per_node=local,
            master_addr=host,
            master_port=port,
            extra_args=rest,
            env=dict(env),
            style="msrun",
            run_scheduler=scheduler,
            run_workers=workers,
            job_id=job_id,
        )

    def restart_cluster(self, cluster: Cluster, attempt: int) -> Cluster:
        if isinstance(cluster, AscendCluster) and cluster.style == "rank_table":
            return cluster  # HCCL has no rendezvous port; the table stays as it is
        return replace(cluster, master_port=restart_port(cluster, attempt))

    # -- planning --------------------------------------------------------------------------
    def plan(self, job: Job, cluster: Cluster, attempt: int = 0) -> LaunchPlan:
        if not isinstance(cluster, AscendCluster):
            raise TypeError("the ascend engine plans from the cluster its own detect() returned")
        if cluster.style == "msrun":
            nodes = self._plan_msrun(job, cluster, attempt)
        else:
            with gc_paused():  # tens of thousands of env dicts when every rank is simulated
                nodes = self._plan_rank_table(job, cluster, attempt)
        notes = list(cluster.notes) + list(cluster.notes_extra)
        return LaunchPlan(
            engine=self.name,
            world_size=cluster.world_size,
            nodes=nodes,
            policy=policy_of(job),
            source=cluster.source,
            simulated=cluster.simulated,
            nnodes=cluster.nnodes,
            master_addr=cluster.master_addr,
            master_port=cluster.master_port,
            attempt=attempt,
            notes=notes,
        )

    def _device_id_mode(self, job: Job, cluster: AscendCluster) -> str:
        mode = job.ascend.device_id
        if mode == "auto":
            remapped = "ASCEND_RT_VISIBLE_DEVICES" in cluster.env or "ASCEND_RT_VISIBLE_DEVICES" in job.env
            return "logical" if remapped else "physical"
        return mode

    def _workdir(self, job: Job, name: str) -> str:
        return str(job.log_path / name) if job.ascend.workdir == "rank" else str(job.code_path)

    def _plan_rank_table(self, job: Job, cluster: AscendCluster, attempt: int) -> list[NodePlan]:
        table = cluster.table
        assert table is not None
        device_mode = self._device_id_mode(job, cluster)
        argv = [*entry_argv(job), *script_args(job, cluster)]
        common = base_env(job, attempt)
        common.update(
            {
                "RANK_TABLE_FILE": cluster.table_file,
                "RANK_SIZE": str(table.rank_size),
                "JOB_ID": cluster.job_id,
            }
        )
        if "HCCL_CONNECT_TIMEOUT" not in job.env and "HCCL_CONNECT_TIMEOUT" not in cluster.env:
            common["HCCL_CONNECT_TIMEOUT"] = HCCL_CONNECT_TIMEOUT
        set_plog = "ASCEND_PROCESS_LOG_PATH" not in job.env and "ASCEND_PROCESS_LOG_PATH" not in cluster.env
        # Resolved once: job.log_path resolves symlinks on the file system, too slow per rank at 65,536 ranks.
        log_dir = job.log_path
        rank_log = log_file(job, "rank0")[: -len("rank0.log")]  # the directory prefix log_file() uses
        code_dir = str(job.code_path)
        nodes = []
        for index in cluster.local_nodes():
            server = table.servers[index]
            rank_start = str(server.rank_start)
            procs = []
            for local, dev in enumerate(server.devices):
                if cluster.only_rank is not None and dev.rank_id != cluster.only_rank:
                    continue
                rank = dev.rank_id
                rank_dir = f"{log_dir}/rank_{rank}"
                env = dict(common)
                env.update(
                    {
                        "RANK_ID": str(rank),
                        "DEVICE_ID": dev.device_id if device_mode == "physical" else str(local),
                        "ASCEND_DEVICE_ID": str(local),
                        "RANK_START": rank_start,
                        "MA_CURRENT_HOST_IP": server.server_id,
                        "MLAUNCH_RANK_DIR": rank_dir,
                        NODE_LEADER_ENV: "1" if local == 0 else "0",
                    }
                )
                if set_plog:
                    env["ASCEND_PROCESS_LOG_PATH"] = f"{rank_dir}/plog"
                procs.append(
                    ProcessSpec(
                        rank=rank,
                        local_rank=local,
                        argv=list(argv),
                        env=env,
                        cwd=rank_dir if job.ascend.workdir == "rank" else code_dir,
                        log=f"{rank_log}rank{rank}.log",
                    )
                )
            bootstrap = []
            if cluster.table_step is not None and (not cluster.simulated or index == 0):
                bootstrap.append(cluster.table_step)  # one writer is enough when every node is simulated here
            host = cluster.host_of(index) if cluster.simulated else server.server_id
            nodes.append(NodePlan(index=index, host=host, processes=procs, bootstrap=bootstrap))
        return nodes

    def _plan_msrun(self, job: Job, cluster: AscendCluster, attempt: int) -> list[NodePlan]:
        world = cluster.world_size
        argv = [*entry_argv(job), *script_args(job, cluster)]
        common = base_env(job, attempt)
        common.update(
            {
                "MS_SCHED_HOST": cluster.master_addr,
                "MS_SCHED_PORT": str(cluster.master_port),
                "MS_WORKER_NUM": str(world),
                "RANK_SIZE": str(world),
                "JOB_ID": cluster.job_id,
            }
        )
        nodes = []
        for index in cluster.local_nodes():
            procs = []
            if cluster.run_scheduler and (not cluster.simulated or index == 0):
                env = dict(common)
                env.update({"MS_ROLE": "MS_SCHED", "RANK_ID": "0", NODE_LEADER_ENV: "1"})
                procs.append(
                    ProcessSpec(
                        rank=-1,
                        local_rank=-1,
                        argv=list(argv),
                        env=env,
                        cwd=self._workdir(job, "scheduler"),
                        log=log_file(job, "scheduler"),
                        role="scheduler",
                        required=True,  # it exits by itself after the workers, with their verdict
                        label="scheduler",
                    )
                )
            if cluster.run_workers:
                for local in range(cluster.procs_per_node):
                    rank = index * cluster.procs_per_node + local
                    env = dict(common)
                    env.update(
                        {
                            "MS_ROLE": "MS_WORKER",
                            "MS_NODE_ID": str(rank),
                            "RANK_ID": str(rank),
                            "DEVICE_ID": str(local),
                            "MLAUNCH_RANK_DIR": str(job.log_path / f"rank_{rank}"),
                            NODE_LEADER_ENV: "1" if local == 0 else "0",
                        }
                    )
                    procs.append(
                        ProcessSpec(
                            rank=rank,
                            local_rank=local,
                            argv=list(argv),
                            env=env,
                            cwd=self._workdir(job, f"rank_{rank}"),
                            log=log_file(job, f"rank{rank}"),
                        )
                    )
            nodes.append(NodePlan(index=index, host=cluster.host_of(index), processes=procs))
        return nodes

    # -- node-level side effects -----------------------------------------------------------
    def prepare(self, job: Job, plan: LaunchPlan) -> Callable[[], None] | None:
        """Write the simulated / converted rank table and create per-rank working directories."""
        for node in plan.nodes:
            for step in node.bootstrap:
                if step.name == WRITE_TABLE_STEP:
                    write_table(step.params)
            for proc in node.processes:
                Path(proc.cwd).mkdir(parents=True, exist_ok=True)
        return None


def write_table(params: Mapping[str, object]) -> Path:
    """Carry out a ``write_rank_table`` bootstrap step (generate for simulation, or convert legacy)."""
    path = str(params["path"])
    if "convert_from" in params:
        source = Path(str(params["convert_from"]))
        table = parse_rank_table(read_rank_table_json(source), str(source))
        return write_rank_table(table.to_json(), path)
    servers, devices = params["servers"], params["devices"]
    assert isinstance(servers, int) and isinstance(devices, int)
    return write_rank_table(generate_rank_table(servers, devices), path)


def resolve_sched_host(host: str) -> tuple[str, str | None]:
    """MindSpore's MS_SCHED_HOST wants an IP address; resolve a host name now if it can be."""
    if not host or host == LOOPBACK or all(part.isdigit() for part in host.split(".")) or ":" in host:
        return host, None
    try:
        return socket.gethostbyname(host), None
    except OSError:
        return host, f"could not resolve the scheduler host {host!r} yet; MS_SCHED_HOST is left as that name"


ENGINE = AscendEngine()
