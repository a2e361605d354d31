"""TensorFlow cluster specs: read them from every platform input, compare them, find this task.

Inputs (platform_spec.md §2.2, §3.2, §4):
- ModelArts flags appended to the start file: ``--ps_hosts``, ``--worker_hosts`` (comma lists of
  ``host:port``, sometimes in ``[...]``), ``--task_index`` and the role as ``--job_name`` or
  ``--task_name`` (both spellings are in ModelArts' docs);
- ``TF_CONFIG`` (Kubeflow TFJob, Volcano's tensorflow plugin): ``cluster``, ``task`` and extras
  such as ``"environment": "cloud"``, which are passed on; a sparse worker map is accepted when
  its indices are 0..n-1;
- Volcano svc env: ``VC_PS_HOSTS``/``VC_WORKER_HOSTS``/``VC_CHIEF_HOSTS`` (bare host names; the
  port is ``tensorflow.port``), ``VC_TASK_INDEX``, the role from ``MA_TASK_NAME`` or this pod's
  host name ``<job>-<task>-<i>``.
Two inputs that both describe the cluster must agree (host names compared without ports when
one side has none), or detection stops with a ``PlatformError`` naming both.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launchers.address import address_host
from launchers.config.limits import MAX_WORLD_SIZE
from launchers.errors import PlatformError
from launchers.platform.numbers import env_int, parse_int, parse_json

TF_PLATFORM_ARGS = ("ps_hosts", "worker_hosts", "task_index", "job_name", "task_name")
ROLES = ("chief", "worker", "ps", "evaluator")


@dataclass
class TfSighting:
    """One input's view: the cluster, this process's task (if it says), where it came from."""

    source: str
    cluster: dict[str, list[str]]
    task_type: str | None = None
    task_index: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # other TF_CONFIG keys, passed on
    role_flag: str | None = None  # "job_name" / "task_name" when flags carried the role
    # Which input said what, for messages that name the argument or variable to fix:
    hosts_from: dict[str, list[str]] = field(default_factory=dict)  # role → inputs listing its hosts
    cluster_from: list[str] = field(default_factory=list)  # the inputs that describe the cluster
    type_from: str | None = None  # e.g. "--job_name", "TF_CONFIG task.type", "MA_TASK_NAME"
    index_from: str | None = None  # e.g. "--task_index", "TF_CONFIG task.index", "VC_TASK_INDEX"

    def listing(self, role: str) -> str:
        """The inputs that list ``role``'s hosts, or those that describe the cluster when none does."""
        named = self.hosts_from.get(role) or self.cluster_from
        return " and ".join(named) or self.source


def parse_host_list(raw: str, what: str) -> list[str]:
    """``a:1,b:2``, ``[a:1, b:2]`` or ``["a:1","b:2"]`` → ``["a:1", "b:2"]``."""
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    hosts = [h.strip().strip("'\"").strip() for h in text.split(",")] if text.strip() else []
    if any(not h for h in hosts):
        raise PlatformError(f"{what}={raw!r} has an empty entry; expected host:port,host:port")
    return hosts


def _index(raw: object, what: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    if not isinstance(raw, str):
        raise PlatformError(f"{what}={raw!r} is not an integer; expected the task's index from 0")
    return parse_int(raw, what, maximum=MAX_WORLD_SIZE - 1, meaning="the task's index from 0")


def _role(raw: str, what: str) -> str:
    role = raw.strip().lower()
    if role not in ROLES:
        raise PlatformError(f"{what}={raw!r}: expected one of {', '.join(ROLES)}")
    return role


def from_flags(args: Mapping[str, str], env: Mapping[str, str]) -> TfSighting | None:
    """ModelArts' appended ``--ps_hosts --worker_hosts --task_index --job_name|--task_name``."""
    if not args:
        return None
    if "worker_hosts" not in args:
        given = ", ".join(f"--{k}" for k in args)
        raise PlatformError(f"TensorFlow platform arguments ({given}) were given without --worker_hosts")
    cluster = {"worker": parse_host_list(args["worker_hosts"], "--worker_hosts")}
    if "ps_hosts" in args:
        cluster["ps"] = parse_host_list(args["ps_hosts"], "--ps_hosts")
    s = TfSighting("modelarts-tf-flags", cluster, hosts_from={role: [f"--{role}_hosts"] for role in cluster})
    s.cluster_from = ["/".join(f"--{role}_hosts" for role in cluster)]
    names = [n for n in ("job_name", "task_name") if n in args]
    if len(names) == 2 and args["job_name"].strip() != args["task_name"].strip():
        raise PlatformError(
            f"platform arguments disagree on this task's role: --job_name={args['job_name']} but "
            f"--task_name={args['task_name']}"
        )
    if names:
        s.role_flag = names[0]
        s.task_type = _role(args[names[0]], f"--{names[0]}")
        s.type_from = f"--{names[0]}"
    if "task_index" in args:
        s.task_index = _index(args["task_index"], "--task_index")
        s.index_from = "--task_index"
    return s


def _cluster_from_json(raw: Any, where: str) -> dict[str, list[str]]:
    if not isinstance(raw, dict) or not raw:
        raise PlatformError(f"{where}: 'cluster' must be a non-empty object of role → list of host:port")
    cluster: dict[str, list[str]] = {}
    for role, hosts in raw.items():
        if isinstance(hosts, dict):  # Kubeflow's sparse form {"0": "h:p", "1": ...}
            indexed = {_index(k, f"{where}: cluster.{role} index"): v for k, v in hosts.items()}
            if sorted(indexed) != list(range(len(indexed))):
                raise PlatformError(
                    f"{where}: cluster.{role} is sparse ({sorted(indexed)}); mlaunch needs indices 0..n-1"
                )
            hosts = [indexed[i] for i in range(len(indexed))]
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
            raise PlatformError(f"{where}: cluster.{role} must be a list of 'host:port' strings")
        cluster[str(role).lower()] = list(hosts)
    return cluster


def from_tf_config(env: Mapping[str, str]) -> TfSighting | None:
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    data = parse_json(raw, "platform env TF_CONFIG")
    if not isinstance(data, dict):
        raise PlatformError("platform env TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    s = TfSighting("TF_CONFIG", _cluster_from_json(data.get("cluster"), "platform env TF_CONFIG"))
    s.hosts_from = {role: [f"TF_CONFIG cluster.{role}"] for role in s.cluster}
    s.cluster_from = ["TF_CONFIG cluster"]
    task = data.get("task")
    if task is not None:
        if not isinstance(task, dict) or "type" not in task:
            raise PlatformError('platform env TF_CONFIG: \'task\' must be an object like {"type": "worker", ...}')
        s.task_type = _role(str(task["type"]), "TF_CONFIG task.type")
        s.task_index = _index(task.get("index", 0), "TF_CONFIG task.index")
        s.type_from, s.index_from = "TF_CONFIG task.type", "TF_CONFIG task.index"
    s.extras = {k: v for k, v in data.items() if k not in ("cluster", "task")}
    return s


def _pod_role(hosts: Mapping[str, list[str]], hostname: str) -> tuple[str, int] | None:
    short = hostname.split(".")[0]
    for role, names in hosts.items():
        for i, name in enumerate(names):
            if address_host(name).split(".")[0] == short:
                return role, i
    return None


def from_volcano_env(env: Mapping[str, str], port: int, hostname: str | None = None) -> TfSighting | None:
    """Volcano svc plugin: VC_<TASK>_HOSTS for ps (required to read this as TF) and worker/chief."""
    if not env.get("VC_PS_HOSTS", "").strip():
        return None
    cluster: dict[str, list[str]] = {}
    for role in ROLES:
        raw = env.get(f"VC_{role.upper()}_HOSTS", "").strip()
        if raw:
            cluster[role] = [h if ":" in h else f"{h}:{port}" for h in parse_host_list(raw, f"VC_{role.upper()}_HOSTS")]
            num = env_int(env, f"VC_{role.upper()}_NUM", minimum=0, meaning=f"the number of {role} pods")
            if num is not None and num != len(cluster[role]):
                raise PlatformError(
                    f"platform env VC_{role.upper()}_NUM={num} but VC_{role.upper()}_HOSTS lists {len(cluster[role])}"
                )
    if "worker" not in cluster and "chief" not in cluster:
        raise PlatformError("platform env VC_PS_HOSTS is set but VC_WORKER_HOSTS (or VC_CHIEF_HOSTS) is not")
    s = TfSighting("volcano-tf", cluster, hosts_from={role: [f"VC_{role.upper()}_HOSTS"] for role in cluster})
    s.cluster_from = ["/".join(f"VC_{role.upper()}_HOSTS" for role in cluster)]
    task_name = env.get("MA_TASK_NAME", "").strip()
    if task_name:
        s.task_type = _role(task_name, "platform env MA_TASK_NAME")
        s.type_from = "MA_TASK_NAME"
    index = None
    for name in ("VC_TASK_INDEX", "VK_TASK_INDEX"):
        index = env_int(env, name, meaning="this pod's index within its task")
        if index is not None:
            s.index_from = name
            break
    if s.task_type is None:
        found = _pod_role(cluster, hostname or socket.gethostname())
        if found is None:
            raise PlatformError(
                "cannot tell whether this pod is a ps, worker or chief: MA_TASK_NAME is not set and the host "
                f"name {hostname or socket.gethostname()!r} is in none of VC_PS_HOSTS/VC_WORKER_HOSTS/VC_CHIEF_HOSTS"
            )
        s.task_type, by_name = found
        s.type_from = "the host name"
        if index is None:
            index, s.index_from = by_name, "the host name"
    s.task_index = index
    return s


def _bare(hosts: list[str]) -> list[str]:
    return [address_host(h) for h in hosts]


def _same_hosts(a: list[str], b: list[str]) -> bool:
    if a == b:
        return True
    return _bare(a) == _bare(b)


def merge(sightings: list[TfSighting]) -> TfSighting:
    """The first sighting, after checking every later one agrees with it (cluster and task)."""
    first = sightings[0]
    for other in sightings[1:]:
        for role in set(first.cluster) | set(other.cluster):
            mine, theirs = first.cluster.get(role), other.cluster.get(role)
            if mine is None or theirs is None:
                continue  # Volcano lists every task; flags only ps/worker
            first.hosts_from.setdefault(role, []).extend(other.hosts_from.get(role, []))
            if not _same_hosts(mine, theirs):
                raise PlatformError(
                    f"platform inputs disagree on the {role} hosts: {first.source} says {','.join(mine)}, "
                    f"but {other.source} says {','.join(theirs)}"
                )
        for what, words in (("task_type", "role"), ("task_index", "index")):
            mine_v, theirs_v = getattr(first, what), getattr(other, what)
            if mine_v is not None and theirs_v is not None and mine_v != theirs_v:
                raise PlatformError(
                    f"platform inputs disagree on this task's {words}: {first.source} says "
                    f"{mine_v}, but {other.source} says {theirs_v}"
                )
        if first.task_type is None:
            first.task_type, first.type_from = other.task_type, other.type_from
        if first.task_index is None:
            first.task_index, first.index_from = other.task_index, other.index_from
        for k, v in other.extras.items():
            first.extras.setdefault(k, v)
        first.cluster_from += [name for name in other.cluster_from if name not in first.cluster_from]
    return first


def resolve_task(s: TfSighting, env: Mapping[str, str]) -> tuple[str, int]:
    """This process's (type, index), with MA_TASK_NAME / VC_TASK_INDEX as fallbacks; checked against the cluster."""
    task_type = s.task_type
    if env.get("MA_TASK_NAME", "").strip():
        named = _role(env["MA_TASK_NAME"], "platform env MA_TASK_NAME")
        if task_type is not None and named != task_type:
            raise PlatformError(
                f"platform inputs disagree on this task's role: {s.source} says {task_type}, "
                f"but MA_TASK_NAME says {named}"
            )
        task_type, s.type_from = named, "MA_TASK_NAME"
    if task_type is None:
        raise PlatformError(
            f"{s.source} describes the cluster but not this task's role; expected --job_name (or --task_name) "
            "ps|worker, TF_CONFIG task.type, or MA_TASK_NAME"
        )
    index = s.task_index
    for name in ("VC_TASK_INDEX", "VK_TASK_INDEX"):
        pod_index = env_int(env, name, meaning="this task's index")
        if pod_index is None:
            continue
        if index is not None and pod_index != index:
            raise PlatformError(
                f"platform inputs disagree on this task's index: {s.source} says {index}, but {name} says {pod_index}"
            )
        index, s.index_from = pod_index, name
        break
    hosts = s.cluster.get(task_type)
    if not hosts:
        article = "an" if task_type[0] in "aeiou" else "a"
        raise PlatformError(
            f"this task is {article} {task_type} ({s.type_from or s.source} says so) but {s.listing(task_type)} "
            f"lists no {task_type} hosts"
        )
    if index is None:
        if len(hosts) > 1:
            raise PlatformError(
                f"{s.listing(task_type)} lists {len(hosts)} {task_type} tasks but not which one this is; expected "
                "--task_index, TF_CONFIG task.index or VC_TASK_INDEX"
            )
        index = 0
    if index >= len(hosts):
        raise PlatformError(_index_past_hosts(s, task_type, index, hosts))
    return task_type, index


def _index_past_hosts(s: TfSighting, task_type: str, index: int, hosts: list[str]) -> str:
    """This task's index is past the hosts listed for its role: name the index's input and the list's."""
    given = f"{s.index_from}={index}" if s.index_from else f"index {index}"
    listing = s.listing(task_type)
    verb = "list" if " and " in listing else "lists"
    shown = ",".join(hosts[:4]) + (",..." if len(hosts) > 4 else "")
    plural = "s" if len(hosts) != 1 else ""
    return (
        f"this task is {task_type} {index} ({given}) but {listing} {verb} {len(hosts)} {task_type} host{plural} "
        f"({shown}); expected {s.index_from or 'the index'} from 0 to {len(hosts) - 1}, or this task's host in "
        f"{listing}"
    )
