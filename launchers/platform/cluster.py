"""Platform detection: what the platform injected → a ``Cluster``.

Inputs, in order of precedence (the first that states a fact wins; a fact stated by two
inputs must agree, or detection fails with a message naming both):

1. **Arguments the platform appends** after the job's own (ModelArts PyTorch-GPU):
   ``--init_method tcp://IP:PORT --rank NODE --world_size NODES`` (``--k v`` or ``--k=v``).
   They are node-level: ``--rank`` is the node index, ``--world_size`` the number of nodes.
2. **A torch launcher's env**: Kubeflow PyTorchJob (``PET_NNODES``, ``PET_NODE_RANK``,
   ``PET_NPROC_PER_NODE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` =
   pods × nproc), MindCluster's ascend-operator (``MINDX_TASK_ID``/``LOCAL_WORLD_SIZE``;
   ``WORLD_SIZE`` counts devices), the Volcano pytorch plugin (``MASTER_ADDR``, ``RANK``,
   ``WORLD_SIZE`` = pods).
3. **ModelArts env**: ``MA_NUM_HOSTS``, ``MA_NUM_GPUS``, ``VC_TASK_INDEX`` (fallback
   ``VK_TASK_INDEX``, ``MA_TASK_INDEX``), ``VC_WORKER_HOSTS`` or names built from
   ``MA_VJ_NAME``/``MA_TASK_NAME`` (``ma-job`` → ``modelarts-job``).
4. **Volcano svc/env plugins** alone: ``VC_WORKER_HOSTS``, ``VC_WORKER_NUM``, ``VC_TASK_INDEX``.
5. None of these → **local simulation**: nodes × processes from job.yaml on 127.0.0.1.

Processes per node: ``PET_NPROC_PER_NODE``, MindCluster ``LOCAL_WORLD_SIZE``, ``MA_NUM_GPUS``
(when > 0), else job.yaml's ``procs_per_node``.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from launchers.config.job import Job
from launchers.errors import PlatformError

PYTORCH_PLATFORM_ARGS = ("init_method", "rank", "world_size")
DEFAULT_MASTER_PORT = 29500
LOOPBACK = "127.0.0.1"


@dataclass
class Cluster:
    """The job's shape as seen from this node."""

    source: str
    simulated: bool
    nnodes: int
    node_rank: int
    procs_per_node: int
    master_addr: str
    master_port: int
    hosts: list[str] = field(default_factory=list)  # per node index, when known
    extra_args: list[str] = field(default_factory=list)  # appended args not consumed: go to the script
    nnodes_spec: str | None = None  # elastic range such as "2:3" (torchrun style only)
    notes: list[str] = field(default_factory=list)
    platform_args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the environment detection saw

    @property
    def world_size(self) -> int:
        return self.nnodes * self.procs_per_node

    def local_nodes(self) -> list[int]:
        """Indices of the nodes whose processes run on this machine."""
        return list(range(self.nnodes)) if self.simulated else [self.node_rank]

    def host_of(self, index: int) -> str:
        if self.simulated:
            return LOOPBACK
        if index < len(self.hosts):
            return self.hosts[index]
        return "localhost" if index == self.node_rank else f"node-{index}"


# ----------------------------------------------------------------------------------------
# Appended platform arguments
# ----------------------------------------------------------------------------------------


def split_platform_args(args: Sequence[str], names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """Take ``--name value`` / ``--name=value`` for the given names; return (found, the rest).

    The rest keeps its order and goes to the start file (ModelArts also appends
    ``--data_url``/``--train_url`` and hyperparameters the script expects). Everything after
    a bare ``--`` is passed through untouched.
    """
    wanted = set(names)
    found: dict[str, str] = {}
    rest: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        token = items[i]
        if token == "--":
            rest.extend(items[i + 1 :])
            break
        name, value = None, None
        if token.startswith("--"):
            key, eq, val = token[2:].partition("=")
            norm = key.replace("-", "_")
            if norm in wanted:
                name = norm
                if eq:
                    value = val
                elif i + 1 < len(items):
                    value = items[i + 1]
                    i += 1
                else:
                    raise PlatformError(f"platform argument --{key} has no value")
        if name is None:
            rest.append(token)
        else:
            assert value is not None
            if name in found and found[name] != value:
                raise PlatformError(
                    f"platform argument --{name} given twice with different values: {found[name]!r} and {value!r}"
                )
            found[name] = value
        i += 1
    return found, rest


def parse_tcp_url(url: str, what: str = "--init_method") -> tuple[str, int]:
    """``tcp://host:port`` → (host, port), with an error that shows the expected form."""
    match = re.fullmatch(r"tcp://(\[[^\]]+\]|[^:/\s]+):(\d{1,5})/?", url.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise PlatformError(f"{what}={url!r} is not a TCP address; expected tcp://HOST:PORT, e.g. tcp://10.0.0.1:6666")
    return match.group(1).strip("[]"), int(match.group(2))


# ----------------------------------------------------------------------------------------
# Sightings: what one input says
# ----------------------------------------------------------------------------------------


@dataclass
class Sighting:
    source: str
    facts: dict[str, object] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # fact → "VAR=value" for messages

    def put(self, fact: str, value: object, origin: str) -> None:
        self.facts[fact] = value
        self.origins[fact] = origin


def env_int(env: Mapping[str, str], name: str, *, minimum: int = 0, meaning: str = "") -> int | None:
    """Integer env var or None; a malformed value is a PlatformError saying what was expected."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise PlatformError(
            f"platform env {name}={raw!r} is not an integer; expected {meaning or 'a whole number'}"
        ) from None
    if value < minimum:
        raise PlatformError(f"platform env {name}={raw!r} must be ≥ {minimum} ({meaning or 'a count'})")
    return value


def _from_args(args: Mapping[str, str]) -> Sighting | None:
    if not args:
        return None
    s = Sighting("modelarts-args")
    if "init_method" in args:
        host, port = parse_tcp_url(args["init_method"])
        s.put("master_addr", host, f"--init_method={args['init_method']}")
        s.put("master_port", port, f"--init_method={args['init_method']}")
    for name, fact, minimum in (("world_size", "nnodes", 1), ("rank", "node_rank", 0)):
        if name in args:
            try:
                value = int(args[name])
            except ValueError:
                raise PlatformError(f"platform argument --{name}={args[name]!r} is not an integer") from None
            if value < minimum:
                raise PlatformError(f"platform argument --{name}={value} must be ≥ {minimum}")
            s.put(fact, value, f"--{name}={value}")
    if "rank" in args and "world_size" not in args:
        raise PlatformError(
            "platform argument --rank was given without --world_size; expected both (node index and number of nodes)"
        )
    if "init_method" not in args and ("rank" in args or "world_size" in args):
        raise PlatformError("platform arguments --rank/--world_size were given without --init_method tcp://HOST:PORT")
    if "nnodes" not in s.facts:
        s.put("nnodes", 1, "--init_method alone (single node)")
        s.put("node_rank", 0, "--init_method alone (single node)")
    return s


def _from_torch_env(env: Mapping[str, str]) -> Sighting | None:
    has_pet = any(k in env for k in ("PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_RDZV_ENDPOINT"))
    mindcluster = "MINDX_TASK_ID" in env and "LOCAL_WORLD_SIZE" in env
    plain = "MASTER_ADDR" in env and "RANK" in env and "WORLD_SIZE" in env
    if not (has_pet or mindcluster or plain):
        return None
    if mindcluster:
        s = Sighting("mindcluster")
        local = env_int(env, "LOCAL_WORLD_SIZE", minimum=1, meaning="NPUs per pod")
        world = env_int(env, "WORLD_SIZE", minimum=1, meaning="total NPUs (MindCluster counts devices)")
        assert local is not None
        s.put("nproc", local, f"LOCAL_WORLD_SIZE={local}")
        if world is not None:
            if world % local:
                raise PlatformError(
                    f"MindCluster env WORLD_SIZE={world} (devices) is not a multiple of LOCAL_WORLD_SIZE={local} "
                    "(devices per pod)"
                )
            s.put("nnodes", world // local, f"WORLD_SIZE={world}/LOCAL_WORLD_SIZE={local}")
        rank = env_int(env, "RANK", meaning="the pod rank")
        if rank is not None:
            s.put("node_rank", rank, f"RANK={rank}")
    elif has_pet:
        s = Sighting("kubeflow-pytorchjob")
        spec = env.get("PET_NNODES", "").strip()
        if spec:
            if re.fullmatch(r"\d+:\d+", spec):
                lo, hi = (int(x) for x in spec.split(":"))
                if lo < 1 or hi < lo:
                    raise PlatformError(f"platform env PET_NNODES={spec!r}: expected MIN:MAX with 1 ≤ MIN ≤ MAX")
                s.put("nnodes_spec", spec, f"PET_NNODES={spec}")
                s.put("nnodes", lo, f"PET_NNODES={spec}")
            else:
                nn = env_int(env, "PET_NNODES", minimum=1, meaning="the number of nodes or MIN:MAX")
                s.put("nnodes", nn, f"PET_NNODES={nn}")
        rank = env_int(env, "PET_NODE_RANK", meaning="the node rank")
        if rank is None:
            rank = env_int(env, "RANK", meaning="the pod rank")
            if rank is not None:
                s.put("node_rank", rank, f"RANK={rank}")
        else:
            s.put("node_rank", rank, f"PET_NODE_RANK={rank}")
        nproc = env.get("PET_NPROC_PER_NODE", "").strip()
        if nproc and nproc.isdigit():
            s.put("nproc", int(nproc), f"PET_NPROC_PER_NODE={nproc}")
        elif nproc and nproc not in ("auto", "gpu", "cpu"):
            raise PlatformError(f"platform env PET_NPROC_PER_NODE={nproc!r}: expected a number of processes")
        world = env_int(env, "WORLD_SIZE", minimum=1, meaning="pods × processes per node")
        if world is not None:
            s.put("world_size_env", world, f"WORLD_SIZE={world}")
    else:
        s = Sighting("volcano-pytorch")
        world = env_int(env, "WORLD_SIZE", minimum=1, meaning="the number of pods (Volcano pytorch plugin)")
        rank = env_int(env, "RANK", meaning="the pod rank")
        s.put("nnodes", world, f"WORLD_SIZE={world}")
        s.put("node_rank", rank, f"RANK={rank}")
    endpoint = env.get("PET_RDZV_ENDPOINT", "").strip()
    if endpoint:  # elastic PyTorchJob: torchrun's rendezvous endpoint (host:port), not a master
        rdzv_host, rdzv_port = parse_tcp_url(f"tcp://{endpoint}", "PET_RDZV_ENDPOINT")
        s.put("master_addr", rdzv_host, f"PET_RDZV_ENDPOINT={endpoint}")
        s.put("master_port", rdzv_port, f"PET_RDZV_ENDPOINT={endpoint}")
    if env.get("MASTER_ADDR") and "master_addr" not in s.facts:
        s.put("master_addr", env["MASTER_ADDR"].strip(), f"MASTER_ADDR={env['MASTER_ADDR']}")
    port = env_int(env, "MASTER_PORT", minimum=1, meaning="a TCP port")
    if port is not None and "master_port" not in s.facts:
        if port > 65535:
            raise PlatformError(f"platform env MASTER_PORT={port} is not a TCP port (1..65535)")
        s.put("master_port", port, f"MASTER_PORT={port}")
    return s


def normalise_vj_name(name: str) -> str:
    """ModelArts job names appear as ``ma-job-…``; DNS names use ``modelarts-job-…``."""
    return name.replace("ma-job", "modelarts-job", 1)


def modelarts_hosts(env: Mapping[str, str], count: int | None) -> list[str]:
    """Per-node DNS names: ``VC_WORKER_HOSTS``, else ``<job>-<task>-<i>.<job>`` from MA_VJ_NAME."""
    raw = env.get("VC_WORKER_HOSTS", "").strip()
    if raw:
        hosts = [h.strip() for h in raw.split(",")]
        if any(not h for h in hosts):
            raise PlatformError(f"platform env VC_WORKER_HOSTS={raw!r} has an empty entry; expected host1,host2,...")
        return hosts
    vj = env.get("MA_VJ_NAME", "").strip()
    if vj and count:
        job = normalise_vj_name(vj)
        task = env.get("MA_TASK_NAME", "worker").strip() or "worker"
        return [f"{job}-{task}-{i}.{job}" for i in range(count)]
    return []


def _task_index(env: Mapping[str, str]) -> tuple[int | None, str]:
    for name in ("VC_TASK_INDEX", "VK_TASK_INDEX", "MA_TASK_INDEX"):
        value = env_int(env, name, meaning="this node's index, from 0")
        if value is not None:
            return value, f"{name}={value}"
    return None, ""


def _from_modelarts_env(env: Mapping[str, str]) -> Sighting | None:
    if not any(k in env for k in ("MA_NUM_HOSTS", "MA_VJ_NAME")):
        return None
    s = Sighting("modelarts")
    nnodes = env_int(env, "MA_NUM_HOSTS", minimum=1, meaning="the number of nodes")
    if nnodes is not None:
        s.put("nnodes", nnodes, f"MA_NUM_HOSTS={nnodes}")
    hosts = modelarts_hosts(env, nnodes)
    if hosts:
        if nnodes is not None and len(hosts) != nnodes:
            raise PlatformError(
                f"platform env VC_WORKER_HOSTS lists {len(hosts)} hosts but MA_NUM_HOSTS={nnodes}; "
                "expected one host per node"
            )
        s.put("hosts", hosts, "VC_WORKER_HOSTS" if env.get("VC_WORKER_HOSTS") else "MA_VJ_NAME")
        s.put("master_addr", hosts[0], f"first host {hosts[0]}")
        if nnodes is None:
            s.put("nnodes", len(hosts), f"VC_WORKER_HOSTS ({len(hosts)} hosts)")
    index, origin = _task_index(env)
    if index is not None:
        s.put("node_rank", index, origin)
    gpus = env_int(env, "MA_NUM_GPUS", meaning="accelerators per node")
    if gpus:
        s.put("nproc", gpus, f"MA_NUM_GPUS={gpus}")
    return s


def _from_volcano_env(env: Mapping[str, str]) -> Sighting | None:
    if not env.get("VC_WORKER_HOSTS", "").strip():
        return None
    s = Sighting("volcano")
    hosts = modelarts_hosts(env, None)
    s.put("hosts", hosts, "VC_WORKER_HOSTS")
    s.put("master_addr", hosts[0], f"first host of VC_WORKER_HOSTS {hosts[0]}")
    num = env_int(env, "VC_WORKER_NUM", minimum=1, meaning="the number of worker pods")
    if num is not None and num != len(hosts):
        raise PlatformError(f"platform env VC_WORKER_NUM={num} but VC_WORKER_HOSTS lists {len(hosts)} hosts")
    s.put("nnodes", len(hosts), f"VC_WORKER_HOSTS ({len(hosts)} hosts)")
    index, origin = _task_index(env)
    if index is not None:
        s.put("node_rank", index, origin)
    return s


# ----------------------------------------------------------------------------------------
# Merging
# ----------------------------------------------------------------------------------------

_FACT_WORDS = {
    "nnodes": "the number of nodes",
    "node_rank": "this node's index",
    "nproc": "processes per node",
    "master_port": "the master port",
}


def merge_sightings(sightings: list[Sighting]) -> dict[str, object]:
    """First sighting wins per fact; numeric facts stated twice must agree."""
    merged: dict[str, object] = {}
    origin_of: dict[str, str] = {}
    for s in sightings:
        for fact, value in s.facts.items():
            if fact not in merged:
                merged[fact] = value
                origin_of[fact] = f"{s.origins[fact]} ({s.source})"
            elif fact in _FACT_WORDS and merged[fact] != value:
                raise PlatformError(
                    f"platform inputs disagree on {_FACT_WORDS[fact]}: {origin_of[fact]} says {merged[fact]}, "
                    f"but {s.origins[fact]} ({s.source}) says {value}. Fix the job's platform settings; "
                    "mlaunch will not guess which one is right."
                )
    merged["_origins"] = origin_of
    return merged


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def collect_sightings(env: Mapping[str, str], args: Mapping[str, str]) -> list[Sighting]:
    """Every platform input present, in precedence order."""
    found = [
        _from_args(args),
        _from_torch_env(env),
        _from_modelarts_env(env),
    ]
    # VC_TASK_INDEX is an index *within a task*: with a master/worker torch env (Volcano
    # pytorch plugin, Kubeflow) it is not the node rank, so plain Volcano env is read only alone.
    if not any(found):
        found.append(_from_volcano_env(env))
    sightings = [s for s in found if s is not None]
    # MA_NUM_GPUS alone does not make a platform (a laptop may have it set), but on a platform
    # node whose topology came from elsewhere (appended args) it still sets processes per node.
    if sightings and not any(s.source == "modelarts" for s in sightings):
        gpus = env_int(env, "MA_NUM_GPUS", meaning="accelerators per node")
        if gpus:
            extra = Sighting("modelarts")
            extra.put("nproc", gpus, f"MA_NUM_GPUS={gpus}")
            sightings.append(extra)
    return sightings


def detect(
    job: Job,
    env: Mapping[str, str],
    extra_args: Sequence[str] = (),
    *,
    consumes: Iterable[str] = PYTORCH_PLATFORM_ARGS,
    default_port: int = DEFAULT_MASTER_PORT,
    simulate: bool = False,
) -> Cluster:
    """Build the Cluster for this node from env + appended args (or simulate one locally)."""
    args, rest = split_platform_args(extra_args, consumes)
    sightings = [] if simulate else collect_sightings(env, args)
    if simulate and args:
        raise PlatformError(
            f"--simulate cannot be combined with platform arguments ({', '.join('--' + a for a in args)})"
        )
    if not sightings:
        return local_cluster(job, rest, env)
    facts = merge_sightings(sightings)
    sources = "+".join(s.source for s in sightings)
    notes: list[str] = []
    nnodes = int(facts.get("nnodes", 1))  # type: ignore[call-overload]
    if "node_rank" not in facts:
        if nnodes > 1 and not facts.get("nnodes_spec"):  # an elastic range: torchrun's agent assigns ranks
            raise PlatformError(
                f"the platform ({sources}) says there are {nnodes} nodes but not which one this is; "
                "expected VC_TASK_INDEX (or VK_TASK_INDEX), RANK/PET_NODE_RANK, or --rank"
            )
        facts["node_rank"] = 0
    node_rank = int(facts["node_rank"])  # type: ignore[call-overload]
    if not 0 <= node_rank < nnodes:
        origins = facts["_origins"]
        assert isinstance(origins, dict)
        raise PlatformError(
            f"this node's index {node_rank} ({origins.get('node_rank')}) is outside 0..{nnodes - 1} "
            f"for {nnodes} nodes ({origins.get('nnodes', 'default')})"
        )
    nproc = int(facts.get("nproc", job.procs_per_node))  # type: ignore[call-overload]
    if "nproc" in facts and job.procs_per_node not in (1, nproc):
        notes.append(
            f"job.yaml asks for procs_per_node: {job.procs_per_node}, the platform gives {nproc} "
            "per node; following the platform"
        )
    if job.nodes not in (1, nnodes):
        notes.append(f"job.yaml says nodes: {job.nodes}, the platform runs {nnodes}; following the platform")
    world_env = facts.get("world_size_env")
    if world_env is not None and world_env != nnodes * nproc and world_env != nnodes:
        raise PlatformError(
            f"platform env WORLD_SIZE={world_env} fits neither {nnodes} nodes × {nproc} processes "
            f"= {nnodes * nproc} nor {nnodes} pods; check PET_NNODES/PET_NPROC_PER_NODE"
        )
    hosts = list(facts.get("hosts", []))  # type: ignore[call-overload]
    master_addr = str(facts.get("master_addr") or (hosts[0] if hosts else ""))
    if not master_addr:
        if nnodes > 1:
            raise PlatformError(
                f"the platform ({sources}) runs {nnodes} nodes but names no master address; expected "
                "--init_method tcp://HOST:PORT, MASTER_ADDR, VC_WORKER_HOSTS or MA_VJ_NAME"
            )
        master_addr = LOOPBACK
    master_port = int(facts.get("master_port") or job.pytorch.master_port or default_port)  # type: ignore[call-overload]
    return Cluster(
        source=sources,
        simulated=False,
        nnodes=nnodes,
        node_rank=node_rank,
        procs_per_node=nproc,
        master_addr=master_addr,
        master_port=master_port,
        hosts=hosts,
        extra_args=rest,
        nnodes_spec=facts.get("nnodes_spec"),  # type: ignore[arg-type]
        notes=notes,
        platform_args=dict(args),
        env=dict(env),
    )


def local_cluster(job: Job, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Cluster:
    """Simulate the platform: job.yaml's nodes × procs_per_node on loopback, a free port."""
    return Cluster(
        source="local-simulation",
        simulated=True,
        nnodes=job.nodes,
        node_rank=0,
        procs_per_node=job.procs_per_node,
        master_addr=LOOPBACK,
        master_port=job.pytorch.master_port or free_port(),
        hosts=[LOOPBACK] * job.nodes,
        extra_args=list(extra_args),
        env=dict(env or {}),
    )
