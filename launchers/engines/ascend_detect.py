"""Ascend detection: the platform's Cluster plus the rank table or the msrun layout, as an ``AscendCluster``.

Which style (``rank_table`` or ``msrun``) comes from job.yaml, else from ``MA_RUN_METHOD`` or
MindCluster's ``MS_*`` env. Rank-table style reads the table (``RANK_TABLE_FILE_V_1_0``,
``RANK_TABLE_FILE`` or ``ascend.rank_table``) and finds this server in it; msrun style takes the
scheduler from MindCluster's env or from the platform's master address. With no platform
input both simulate the job on this machine. ``launchers.engines.ascend`` plans from the result.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launchers.config.job import Job
from launchers.errors import PlatformError
from launchers.log import say
from launchers.plan import BootstrapStep
from launchers.platform.ascend_device import per_device_start
from launchers.platform.cluster import (
    LOOPBACK,
    Cluster,
    check_simulated_size,
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
    generate_rank_table,
    load_rank_table,
    parse_rank_table,
)

WRITE_TABLE_STEP = "write_rank_table"


@dataclass(frozen=True)
class AscendCluster:
    """The cluster as the Ascend engine sees it: the platform's ``Cluster``, plus the rank table or msrun layout.

    It holds that Cluster (``base``) instead of copying its fields. Reading one of them
    (``nnodes``, ``env``, ``host_of()``...) reads ``base``, so the runner and job-wide features
    (high availability) read an AscendCluster as they read any Cluster; a changed one is a new
    AscendCluster around ``replace(base, ...)``.
    """

    base: Cluster
    style: str = "rank_table"
    table: RankTable | None = None
    table_file: str = ""  # what processes get as RANK_TABLE_FILE
    table_step: BootstrapStep | None = None  # how prepare() writes table_file (simulated / converted)
    only_rank: int | None = None  # ModelArts per-device start: this copy runs just this rank
    job_id: str = ""
    run_scheduler: bool = False  # msrun: this node runs the MS_SCHED process
    run_workers: bool = True  # msrun: this node runs workers (a MindCluster scheduler pod may not)
    server_found_by: str = ""

    @property
    def world_size(self) -> int:
        if self.table is not None:
            return self.table.rank_size
        return self.base.world_size

    def __getattr__(self, name: str) -> Any:
        base = self.__dict__.get("base")  # absent while copy/pickle rebuild the object
        if base is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(base, name)


def job_id_of(job: Job, env: Mapping[str, str]) -> str:
    """davincirun's JOB_ID: MA_VJ_NAME with ma-job → modelarts-job; else the job's name."""
    vj = env.get("MA_VJ_NAME", "").strip()
    return normalise_vj_name(vj) if vj else job.job_name


def rank_table_dir(job: Job) -> Path:
    return job.log_path / "rank_table"


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


# ----------------------------------------------------------------------------------------
# Rank-table style
# ----------------------------------------------------------------------------------------


def table_path(job: Job, env: Mapping[str, str]) -> tuple[Path | None, str]:
    """The rank table to read and where its name came from; (None, "") when nothing names one."""
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


def detect_rank_table(job: Job, env: Mapping[str, str], extra_args: Sequence[str], simulate: bool) -> AscendCluster:
    _, rest = split_platform_args(extra_args, ())
    path, origin = (None, "") if simulate else table_path(job, env)
    job_id = job_id_of(job, {} if simulate else env)
    if path is None:
        return _simulated_table(job, env, rest, job_id)
    try:
        table = load_rank_table(path, wait_timeout=job.ascend.wait_timeout, on_wait=say)
    except PlatformError as exc:  # a table job.yaml named: the error names the file and the key that named it
        if origin != "ascend.rank_table":
            raise
        raise PlatformError(f"{job.source or 'job.yaml'}: ascend.rank_table: {exc}") from None
    notes: list[str] = []
    started = per_device_start(env)
    only_rank = None
    if started is not None:
        server, only_rank, note = _per_device_server(table, env, path, started)
        found_by = f"RANK_ID={only_rank} (ModelArts per-device start)"
        notes.append(note)
    else:
        server, found_by = find_this_server(table, env)
    _cross_check(table, env, path)
    table_file = str(path)
    step = None
    if table.source_format == "legacy":
        table_file = str(rank_table_dir(job) / "hccl_v1.0.json")
        step = BootstrapStep(WRITE_TABLE_STEP, {"path": table_file, "convert_from": str(path)})
        notes.append(f"legacy group_list rank table {path} is converted to version 1.0 at {table_file}")
    hosts = [s.host_ip or s.server_id for s in table.servers]
    base = Cluster(
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
    )
    return AscendCluster(
        base,
        table=table,
        table_file=table_file,
        table_step=step,
        only_rank=only_rank,
        job_id=job_id,
        server_found_by=found_by,
    )


def _per_device_server(
    table: RankTable, env: Mapping[str, str], path: Path, started: tuple[int, int]
) -> tuple[Server, int, str]:
    """ModelArts started this copy for one device (``ASCEND_DEVICE_ID``, ``RANK_ID``): its server, rank, note."""
    device, rank = started
    held = table.server_of_rank(rank)
    if held is None:
        raise PlatformError(f"platform env RANK_ID={rank} is not in rank table {path} (ranks 0..{table.rank_size - 1})")
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
    note = (
        f"ModelArts per-device start (ASCEND_DEVICE_ID={device}, RANK_ID={rank}): this copy runs rank "
        f"{rank} only; node-level work is done by the copy with ASCEND_DEVICE_ID=0"
    )
    return server, rank, note


def _cross_check(table: RankTable, env: Mapping[str, str], path: Path) -> None:
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


def _simulated_table(job: Job, env: Mapping[str, str], rest: list[str], job_id: str) -> AscendCluster:
    check_simulated_size(job)
    nodes, devices = job.nodes, job.procs_per_node
    table = parse_rank_table(generate_rank_table(nodes, devices), "simulated rank table")
    table_file = str(rank_table_dir(job) / f"hccl_{nodes}s_{nodes * devices}p.json")
    return AscendCluster(
        replace(local_cluster(job, rest, env), master_port=0),  # HCCL has no rendezvous port
        table=table,
        table_file=table_file,
        table_step=BootstrapStep(WRITE_TABLE_STEP, {"path": table_file, "servers": nodes, "devices": devices}),
        job_id=job_id,
        server_found_by="local simulation",
    )


# ----------------------------------------------------------------------------------------
# msrun style
# ----------------------------------------------------------------------------------------


def detect_msrun(job: Job, env: Mapping[str, str], extra_args: Sequence[str], simulate: bool) -> AscendCluster:
    job_id = job_id_of(job, {} if simulate else env)
    if not simulate and env.get("MS_SCHED_HOST", "").strip():
        return _detect_mindcluster(job, env, extra_args, job_id)
    base = detect(job, env, extra_args, consumes=(), simulate=simulate)
    if base.simulated:
        port = job.ascend.sched_port if "sched_port" in job.ascend.model_fields_set else free_port()
        return AscendCluster(replace(base, master_port=port), style="msrun", run_scheduler=True, job_id=job_id)
    sched_host, note = resolve_sched_host(base.master_addr)
    notes = [*base.notes, note] if note else base.notes
    held = replace(base, master_addr=sched_host, master_port=job.ascend.sched_port, notes=notes)
    return AscendCluster(held, style="msrun", run_scheduler=base.node_rank == 0, job_id=job_id)


def _detect_mindcluster(job: Job, env: Mapping[str, str], extra_args: Sequence[str], job_id: str) -> AscendCluster:
    """MindCluster env: MS_SCHED_HOST/PORT, MS_ROLE, MS_NODE_RANK, MS_WORKER_NUM, MS_LOCAL_WORKER."""
    _, rest = split_platform_args(extra_args, ())
    port = env_int(env, "MS_SCHED_PORT", minimum=1, meaning="the scheduler's TCP port")
    if port is None or port > 65535:
        raise PlatformError(f"platform env MS_SCHED_PORT={env.get('MS_SCHED_PORT')!r}: expected a TCP port 1..65535")
    nnodes, local, node_rank, role = _mindcluster_layout(job, env)
    scheduler = role == "MS_SCHED"
    # A scheduler pod without NPUs (NPU_POD=false) runs the scheduler only.
    workers = not (scheduler and env.get("NPU_POD", "").strip().lower() == "false")
    base = Cluster(
        source="mindcluster-msrun",
        simulated=False,
        nnodes=nnodes,
        node_rank=node_rank,
        procs_per_node=local,
        master_addr=env["MS_SCHED_HOST"].strip(),
        master_port=port,
        extra_args=rest,
        env=dict(env),
    )
    return AscendCluster(base, style="msrun", run_scheduler=scheduler, run_workers=workers, job_id=job_id)


def _mindcluster_layout(job: Job, env: Mapping[str, str]) -> tuple[int, int, int, str]:
    """(nodes, workers per node, this node's index, MS_ROLE) from MindCluster's env, cross-checked."""
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
    return nnodes, local, node_rank, role


def resolve_sched_host(host: str) -> tuple[str, str | None]:
    """MindSpore's MS_SCHED_HOST wants an IP address; resolve a host name now if it can be."""
    if not host or host == LOOPBACK or all(part.isdigit() for part in host.split(".")) or ":" in host:
        return host, None
    try:
        return socket.gethostbyname(host), None
    except OSError:
        return host, f"could not resolve the scheduler host {host!r} yet; MS_SCHED_HOST is left as that name"
