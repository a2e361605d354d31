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

Detection (which style, the rank table, this server, the scheduler) is
``launchers/engines/ascend_detect.py``; this module plans and prepares from its ``AscendCluster``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from launchers.config.job import Job
from launchers.engines.ascend_detect import (
    WRITE_TABLE_STEP,
    AscendCluster,
    choose_style,
    detect_msrun,
    detect_rank_table,
)
from launchers.engines.base import Cleanup, base_env, entry_argv, log_file, policy_of, restart_port, script_args
from launchers.plan import LaunchPlan, NodePlan, ProcessSpec
from launchers.platform.ascend_device import NODE_LEADER_ENV
from launchers.platform.ranktable import (
    gc_paused,
    generate_rank_table,
    parse_rank_table,
    read_rank_table_json,
    write_rank_table,
)

HCCL_CONNECT_TIMEOUT = "1800"  # davincirun's value when unset (HCCL's own default, 120 s, is short at scale)


class AscendEngine:
    name = "ascend"

    def detect(
        self, job: Job, env: Mapping[str, str], extra_args: Sequence[str], *, simulate: bool = False
    ) -> AscendCluster:
        if choose_style(job, {} if simulate else env) == "msrun":
            return detect_msrun(job, env, extra_args, simulate)
        return detect_rank_table(job, env, extra_args, simulate)

    def restart_cluster(self, cluster: AscendCluster, attempt: int) -> AscendCluster:
        if cluster.style == "rank_table":
            return cluster  # HCCL has no rendezvous port; the table stays as it is
        return replace(cluster, base=replace(cluster.base, master_port=restart_port(cluster.base, attempt)))

    # -- planning --------------------------------------------------------------------------
    def plan(self, job: Job, cluster: AscendCluster, attempt: int = 0) -> LaunchPlan:
        if not isinstance(cluster, AscendCluster):
            raise TypeError("the ascend engine plans from the cluster its own detect() returned")
        if cluster.style == "msrun":
            nodes = self._plan_msrun(job, cluster, attempt)
        else:
            with gc_paused():  # tens of thousands of env dicts when every rank is simulated
                nodes = self._plan_rank_table(job, cluster, attempt)
        return LaunchPlan.for_cluster(
            self.name, cluster.base, nodes, policy=policy_of(job), attempt=attempt, world_size=cluster.world_size
        )

    def _device_id_mode(self, job: Job, cluster: AscendCluster) -> str:
        mode = job.ascend.device_id
        if mode == "auto":
            remapped = "ASCEND_RT_VISIBLE_DEVICES" in cluster.base.env or "ASCEND_RT_VISIBLE_DEVICES" in job.env
            return "logical" if remapped else "physical"
        return mode

    def _plan_rank_table(self, job: Job, cluster: AscendCluster, attempt: int) -> list[NodePlan]:
        table, base = cluster.table, cluster.base
        assert table is not None
        device_mode = self._device_id_mode(job, cluster)
        argv = [*entry_argv(job), *script_args(job, base)]
        common = base_env(job, attempt)
        common.update(
            {
                "RANK_TABLE_FILE": cluster.table_file,
                "RANK_SIZE": str(table.rank_size),
                "JOB_ID": cluster.job_id,
            }
        )
        if "HCCL_CONNECT_TIMEOUT" not in job.env and "HCCL_CONNECT_TIMEOUT" not in base.env:
            common["HCCL_CONNECT_TIMEOUT"] = HCCL_CONNECT_TIMEOUT
        set_plog = "ASCEND_PROCESS_LOG_PATH" not in job.env and "ASCEND_PROCESS_LOG_PATH" not in base.env
        files = _RankFiles(job)
        nodes = []
        for index in base.local_nodes():
            server = table.servers[index]
            rank_start = str(server.rank_start)
            procs = []
            for local, dev in enumerate(server.devices):
                if cluster.only_rank is not None and dev.rank_id != cluster.only_rank:
                    continue
                rank = dev.rank_id
                rank_dir = files.dir(f"rank_{rank}")
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
                procs.append(files.process(rank, local, argv, env))
            bootstrap = []
            if cluster.table_step is not None and (not base.simulated or index == 0):
                bootstrap.append(cluster.table_step)  # one writer is enough when every node is simulated here
            host = base.host_of(index) if base.simulated else server.server_id
            nodes.append(NodePlan(index=index, host=host, processes=procs, bootstrap=bootstrap))
        return nodes

    def _plan_msrun(self, job: Job, cluster: AscendCluster, attempt: int) -> list[NodePlan]:
        world, base = cluster.world_size, cluster.base
        argv = [*entry_argv(job), *script_args(job, base)]
        common = base_env(job, attempt)
        common.update(
            {
                "MS_SCHED_HOST": base.master_addr,
                "MS_SCHED_PORT": str(base.master_port),
                "MS_WORKER_NUM": str(world),
                "RANK_SIZE": str(world),
                "JOB_ID": cluster.job_id,
            }
        )
        files = _RankFiles(job)
        nodes = []
        for index in base.local_nodes():
            procs = []
            if cluster.run_scheduler and (not base.simulated or index == 0):
                env = dict(common)
                env.update({"MS_ROLE": "MS_SCHED", "RANK_ID": "0", NODE_LEADER_ENV: "1"})
                procs.append(
                    ProcessSpec(
                        rank=-1,
                        local_rank=-1,
                        argv=list(argv),
                        env=env,
                        cwd=files.workdir("scheduler"),
                        log=log_file(job, "scheduler"),
                        role="scheduler",
                        required=True,  # it exits by itself after the workers, with their verdict
                        label="scheduler",
                    )
                )
            if cluster.run_workers:
                for local in range(base.procs_per_node):
                    rank = index * base.procs_per_node + local
                    env = dict(common)
                    env.update(
                        {
                            "MS_ROLE": "MS_WORKER",
                            "MS_NODE_ID": str(rank),
                            "RANK_ID": str(rank),
                            "DEVICE_ID": str(local),
                            "MLAUNCH_RANK_DIR": files.dir(f"rank_{rank}"),
                            NODE_LEADER_ENV: "1" if local == 0 else "0",
                        }
                    )
                    procs.append(files.process(rank, local, argv, env))
            nodes.append(NodePlan(index=index, host=base.host_of(index), processes=procs))
        return nodes

    # -- node-level side effects -----------------------------------------------------------
    def prepare(self, job: Job, plan: LaunchPlan) -> Cleanup | None:
        """Write the simulated / converted rank table and create per-rank working directories."""
        for node in plan.nodes:
            for step in node.bootstrap:
                if step.name == WRITE_TABLE_STEP:
                    write_table(step.params)
            for proc in node.processes:
                Path(proc.cwd).mkdir(parents=True, exist_ok=True)
        return None


class _RankFiles:
    """Where a process works and logs: its own directory under the log dir (``ascend.workdir: rank``) or code_dir.

    The directories are resolved once: ``job.log_path`` resolves symlinks on the file system,
    too slow to do per rank at 65,536 ranks.
    """

    def __init__(self, job: Job) -> None:
        self.log_dir = str(job.log_path)
        self.log_prefix = log_file(job, "rank0")[: -len("rank0.log")]  # the directory prefix log_file() uses
        self.code_dir = str(job.code_path)
        self.per_rank = job.ascend.workdir == "rank"

    def dir(self, name: str) -> str:
        return f"{self.log_dir}/{name}"

    def workdir(self, name: str) -> str:
        return self.dir(name) if self.per_rank else self.code_dir

    def process(self, rank: int, local: int, argv: list[str], env: dict[str, str]) -> ProcessSpec:
        """Rank ``rank``'s process: a copy of ``argv``, its working directory and ``rank{N}.log``."""
        cwd, log = self.workdir(f"rank_{rank}"), f"{self.log_prefix}rank{rank}.log"
        return ProcessSpec(rank=rank, local_rank=local, argv=list(argv), env=env, cwd=cwd, log=log)


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


ENGINE = AscendEngine()
