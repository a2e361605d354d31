"""High availability: MindIO TFT env for MindSpore jobs and MindCluster's TaskD manager.

``launchers.planning.plan_attempt`` calls ``apply_high_availability`` on every plan when
``high_availability`` is enabled in job.yaml. It adds what the vendor guides ask users to
write by hand in their start scripts (seeds 000 and 002), computed from job.yaml and the
detected cluster so that every node agrees:

- **Refusals first** (before anything is launched): MindIO TFT restores a rank from a
  replica, so the layout must have ``dp / optimizer_shard`` ≥ 2 (see
  ``launchers.elastic.replicas``), and it works per step, so ``sink_size`` must be 1.
- **MindIO TFT** (``ttp``/``uce``/``arf``, MindSpore/MindFormers): ``MINDIO_FOR_MINDSPORE=1``,
  ``MS_ENABLE_TFT="{TTP:1,UCE:1,ARF:1}"`` (UCE or ARF imply TTP), ``MS_TFT_IP``/``MS_TFT_PORT``
  at node 0 (port 30051) or the configured controller.
- **TaskD** (PyTorch/MindSpeed on MindCluster): the manager runs as a supervised side
  process on node 0 only (``role="taskd-manager"``, ``required=False``: it is stopped when
  the training processes finish, and stops them if it fails); every process gets
  ``LD_PRELOAD`` of ``libtaskd.so`` (found from the installed ``taskd`` package, never a
  hard-coded interpreter path) and of ``libmspti.so`` when the CANN toolkit is present,
  ``HCCL_OP_RETRY_ENABLE``, ``ELASTIC_PROCESS_RECOVER_ENABLE=1`` and ``PROCESS_RECOVER=on``.
- **MindSpeed flags** ``--enable-high-availability --enable-hbmfault-repair`` appended to the
  start file's arguments when ``mindspeed_flags`` is set.

The plan stays pure data: nothing is started or written here (finding ``taskd`` reads the
import path only; for a separate ``python:`` interpreter it asks that interpreter).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from launchers.address import split_host_port
from launchers.config.high_availability import TFT_CONTROLLER_PORT
from launchers.config.job import Job
from launchers.elastic.replicas import ReplicaConfigError, format_groups, replica_count, require_replicas
from launchers.errors import UserError
from launchers.plan import LaunchPlan, ProcessSpec
from launchers.platform.cluster import Cluster

TFT_DEFAULT_PORT = TFT_CONTROLLER_PORT
TASKD_PORT = 9601  # TaskD manager's gRPC port (MgrPort ":9601"); exposed on every pod as `taskd-port`
TASKD_ROLE = "taskd-manager"
TASKD_FLAG_ENV = "MLAUNCH_TASKD"  # tells launchers.elastic.taskd.start_worker that TaskD is on
MINDSPEED_FLAGS = ("--enable-high-availability", "--enable-hbmfault-repair")
LIBTASKD_RELATIVE = Path("python") / "cython_api" / "libs" / "libtaskd.so"
CANN_DEFAULT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"


# ----------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------


def check_high_availability(job: Job, world_size: int) -> list[list[int]]:
    """The replica groups of the job's layout, or ``UserError`` naming the setting to change."""
    ha = job.high_availability
    where = f"{job.source}: " if job.source else ""
    if ha.sink_size != 1:
        raise UserError(
            f"{where}high_availability.sink_size is {ha.sink_size}, but MindIO TFT recovers per step and works "
            "only with sink_size 1; set high_availability.sink_size: 1 (and sink_size: 1 in the MindSpore/"
            "MindFormers runner config)"
        )
    if not {"dp", "tp", "pp"} & ha.model_fields_set:
        raise UserError(
            f"{where}high_availability needs the job's parallel layout to find replicas: set high_availability.dp "
            f"(data_parallel), tp (model_parallel) and pp (pipeline_stage) as in the training config, with "
            f"dp × tp × pp = {world_size} and dp / optimizer_shard ≥ 2"
        )
    try:
        return require_replicas(world_size, ha.dp, ha.tp, ha.pp, ha.optimizer_shard)
    except ReplicaConfigError as exc:
        raise UserError(f"{where}high_availability: {exc} (keys dp, tp, pp, optimizer_shard)") from None


def describe_groups(job: Job, groups: list[list[int]]) -> str:
    """One line for ``mlaunch check``: the layout and its replica groups."""
    ha = job.high_availability
    count = replica_count(ha.dp, ha.optimizer_shard)
    return (
        f"high availability: {len(groups)} replica groups of {count} "
        f"(dp={ha.dp}, tp={ha.tp}, pp={ha.pp}, optimizer_shard={ha.optimizer_shard}): {format_groups(groups)}"
    )


# ----------------------------------------------------------------------------------------
# Env
# ----------------------------------------------------------------------------------------


def tft_features(job: Job) -> list[str]:
    """``["TTP", "UCE", "ARF"]`` as asked; UCE or ARF imply TTP (TTP is the last resort after them)."""
    ha = job.high_availability
    features = []
    if ha.ttp or ha.uce or ha.arf:
        features.append("TTP")
    if ha.uce:
        features.append("UCE")
    if ha.arf:
        features.append("ARF")
    return features


def controller_address(job: Job, cluster: Cluster) -> tuple[str, int]:
    """The TFT controller: job.yaml's ``controller`` (HOST[:PORT]), else node 0 on port 30051."""
    given = job.high_availability.controller
    if given:
        return split_host_port(given, "high_availability.controller", default_port=TFT_DEFAULT_PORT)
    node0 = cluster.hosts[0] if cluster.hosts else cluster.master_addr
    return node0, TFT_DEFAULT_PORT


def tft_env(job: Job, cluster: Cluster) -> dict[str, str]:
    """MindIO TFT's env for MindSpore/MindFormers processes (seed 002)."""
    features = tft_features(job)
    if not features:
        return {}
    host, port = controller_address(job, cluster)
    return {
        "MINDIO_FOR_MINDSPORE": "1",
        "MS_ENABLE_TFT": "{" + ",".join(f"{name}:1" for name in features) + "}",
        "MS_TFT_IP": host,
        "MS_TFT_PORT": str(port),
    }


def cann_home(env: Mapping[str, str]) -> Path | None:
    """The CANN toolkit directory when one is installed (``ASCEND_TOOLKIT_HOME``, ``ASCEND_HOME_PATH``, default)."""
    for name in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        value = env.get(name, "").strip()
        if value and Path(value).is_dir():
            return Path(value)
    default = Path(CANN_DEFAULT_HOME)
    return default if default.is_dir() else None


def libmspti_path(env: Mapping[str, str]) -> Path | None:
    """MindStudio's ``libmspti.so`` from the CANN toolkit, if present."""
    home = cann_home(env)
    if home is None:
        return None
    lib = home / "lib64" / "libmspti.so"
    return lib if lib.is_file() else None


_FIND_TASKD = (
    "import importlib.util, json; s = importlib.util.find_spec('taskd'); "
    "print(json.dumps(list(s.submodule_search_locations or []) if s else None))"
)


def taskd_package_dir(python: str | None, env: Mapping[str, str]) -> Path | None:
    """Where the ``taskd`` package is installed for the interpreter that runs the job (not imported).

    With no ``python:`` in job.yaml the job runs under mlaunch's own interpreter, whose
    import path (including ``PYTHONPATH``) the processes inherit, so ``find_spec`` answers
    here. A different interpreter is asked directly, as ``pip show taskd`` would be.
    """
    if python is None or _same_interpreter(python):
        spec = importlib.util.find_spec("taskd")
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    try:
        out = subprocess.run(
            [python, "-c", _FIND_TASKD], env=dict(env), capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"cannot ask the job's interpreter {python!r} where the taskd package is: {exc}") from None
    found = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    return Path(found[0]) if found else None


def _same_interpreter(python: str) -> bool:
    import shutil

    resolved = shutil.which(python) or python
    try:
        return os.path.samefile(resolved, sys.executable)
    except OSError:
        return False


def libtaskd_path(job: Job, env: Mapping[str, str]) -> Path:
    """``<taskd package>/python/cython_api/libs/libtaskd.so``, or a UserError saying how to install it."""
    package = taskd_package_dir(job.python, env)
    interpreter = job.python or sys.executable
    if package is None:
        raise UserError(
            f"high_availability.taskd is on, but the taskd package is not installed for {interpreter}; install "
            "MindCluster's TaskD wheel (taskd-*.whl, e.g. through prestart.wheels) or set taskd: false. "
            "(The PyPI package named 'taskd' is unrelated.)"
        )
    lib = package / LIBTASKD_RELATIVE
    if not lib.is_file():
        raise UserError(
            f"the taskd package at {package} has no {LIBTASKD_RELATIVE}; is it MindCluster's TaskD? "
            "(The PyPI package named 'taskd' is unrelated.) Install the TaskD wheel from MindCluster"
        )
    return lib


def taskd_env(job: Job, cluster: Cluster) -> dict[str, str]:
    """What every process of a TaskD job gets (seed 000)."""
    env = cluster.env
    preload = [str(p) for p in (libmspti_path(env), libtaskd_path(job, env)) if p is not None]
    inherited = job.env.get("LD_PRELOAD") or env.get("LD_PRELOAD", "")
    preload += [p for p in inherited.replace(" ", ":").split(":") if p and p not in preload]
    return {
        "LD_PRELOAD": ":".join(preload),
        "HCCL_OP_RETRY_ENABLE": job.high_availability.hccl_op_retry,
        "ELASTIC_PROCESS_RECOVER_ENABLE": "1",
        "PROCESS_RECOVER": "on",
        TASKD_FLAG_ENV: "1",
    }


# ----------------------------------------------------------------------------------------
# The TaskD manager process
# ----------------------------------------------------------------------------------------


def taskd_job_id(job: Job, cluster: Cluster) -> str:
    """MindCluster's job UID (``MINDX_TASK_ID``, set by ascend-operator), else the job's name."""
    return (cluster.env.get("MINDX_TASK_ID") or job.job_name).strip()


def taskd_manager_spec(job: Job, cluster: Cluster, plan: LaunchPlan, env: Mapping[str, str]) -> ProcessSpec:
    """``python -m launchers.run.taskd_manager`` for node 0: init + start, then alive until SIGTERM."""
    from launchers.engines.base import base_env, log_file

    proc_env = base_env(job, plan.attempt)
    proc_env.update(env)
    # As MindCluster's guide does before `python manager.py &`: the manager serves on this pod's IP.
    pod_ip = cluster.env.get("POD_IP", "").strip()
    if pod_ip:
        proc_env["MASTER_ADDR"] = pod_ip
    argv = [
        job.python or sys.executable,
        "-m",
        "launchers.run.taskd_manager",
        "--job-id",
        taskd_job_id(job, cluster),
        "--node-nums",
        str(cluster.nnodes),
        "--proc-per-node",
        str(cluster.procs_per_node),
    ]
    return ProcessSpec(
        rank=-1,
        local_rank=-1,
        argv=argv,
        env=proc_env,
        cwd=str(job.code_path),
        log=log_file(job, TASKD_ROLE),
        role=TASKD_ROLE,
        required=False,
        label=TASKD_ROLE,
    )


# ----------------------------------------------------------------------------------------
# The hook
# ----------------------------------------------------------------------------------------


def apply_high_availability(job: Job, cluster: Cluster, plan: LaunchPlan) -> LaunchPlan:
    """The plan with high availability wired in; refuses (UserError) configs that cannot recover."""
    ha = job.high_availability
    if not ha.enabled:
        return plan
    check_high_availability(job, plan.world_size)
    plan = copy.deepcopy(plan)
    env: dict[str, str] = {}
    if ha.tft:
        if plan.engine == "pytorch":
            plan.notes.append(
                "high_availability ttp/uce/arf set MindIO TFT's MindSpore env, which a PyTorch job does not read; "
                "for PyTorch/MindSpeed use taskd: true and mindspeed_flags: true"
            )
        else:
            env.update(tft_env(job, cluster))
    if ha.taskd:
        env.update(taskd_env(job, cluster))
    for node in plan.nodes:
        for proc in node.processes:
            if proc.role == TASKD_ROLE:
                continue
            # job.yaml's own env wins: a user who set MS_TFT_PORT by hand meant it.
            proc.env.update({k: v for k, v in env.items() if k not in job.env or k == "LD_PRELOAD"})
            if ha.mindspeed_flags and proc.required:
                proc.argv = [*proc.argv, *(flag for flag in MINDSPEED_FLAGS if flag not in proc.argv)]
    if ha.taskd:
        from launchers.platform.ascend_device import is_node_leader

        node0 = next((node for node in plan.nodes if node.index == 0), None)
        # ModelArts may start one mlaunch per device: only device 0's copy runs the manager.
        leader = cluster.simulated or is_node_leader(cluster.env)
        if node0 is not None and leader and not any(p.role == TASKD_ROLE for p in node0.processes):
            node0.processes.append(taskd_manager_spec(job, cluster, plan, env))
    return plan
