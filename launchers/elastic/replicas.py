"""MindIO TFT replica groups: which ranks hold identical weights and optimizer state.

A dying checkpoint under MindIO TFT (TTP) is written by one healthy rank per *replica
group*, and UCE/ARF recovery repairs a rank from a member of its group. Both need every
group to have at least two members; otherwise a fault loses state for good. This module
computes the groups before launch so ``mlaunch check`` can print them and refuse a layout
without replicas, instead of the job finding out after its first fault.

The closed form follows MindSpore's semi-auto parallel layout (pipeline stage outermost,
then data parallel, then model/tensor parallel fastest) and reproduces
``get_parameter_redundancy`` and the ``report group list`` lines MindIO logs::

    N  = world size;  pp stages;  S = N / pp ranks per stage
    dp * tp = S;      k = optimizer_shard (optimizer_weight_shard_size), k divides dp
    r  = s*S + q      (s: stage, q: position inside the stage)
    stride = tp * k;  cnt = dp / k      (the replica count)
    group(r) = [ s*S + (q mod stride) + j*stride  for j in 0 .. cnt-1 ]

Examples: 8 ranks, dp=2, tp=4 → [0,4] [1,5] [2,6] [3,7]; 8 ranks, dp=8, k=4 → the same;
dp=2 with k=2 → one replica (refused: MindFormers' docs ask for dp=4 then).

Standard library only, so the elastic runtime and the checks can import it anywhere.
"""

from __future__ import annotations

__all__ = [
    "MIN_REPLICAS",
    "ReplicaConfigError",
    "format_groups",
    "replica_count",
    "replica_group_of",
    "replica_groups",
    "require_replicas",
    "validate_layout",
]

MIN_REPLICAS = 2


class ReplicaConfigError(ValueError):
    """The parallel layout is inconsistent or has no replica relation; the message names the setting."""


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ReplicaConfigError(f"{name} must be a whole number ≥ 1, got {value!r}")


def validate_layout(world_size: int, dp: int, tp: int = 1, pp: int = 1, optimizer_shard: int = 1) -> None:
    """Refuse layouts that cannot exist: dp × tp × pp must be the world size, the shard must divide dp."""
    for name, value in (
        ("world size", world_size),
        ("dp (data_parallel)", dp),
        ("tp (model_parallel)", tp),
        ("pp (pipeline_stage)", pp),
        ("optimizer_shard (optimizer_weight_shard_size)", optimizer_shard),
    ):
        _positive(name, value)
    if dp * tp * pp != world_size:
        raise ReplicaConfigError(
            f"dp × tp × pp = {dp} × {tp} × {pp} = {dp * tp * pp}, but the job runs {world_size} processes; "
            f"set dp, tp and pp so that their product is {world_size}"
        )
    if dp % optimizer_shard:
        raise ReplicaConfigError(
            f"optimizer_shard (optimizer_weight_shard_size) = {optimizer_shard} does not divide dp = {dp}; "
            "set optimizer_shard to a divisor of dp (1 turns optimizer parallelism off)"
        )


def replica_count(dp: int, optimizer_shard: int = 1) -> int:
    """How many ranks hold each piece of state: ``dp / optimizer_shard``."""
    _positive("dp (data_parallel)", dp)
    _positive("optimizer_shard (optimizer_weight_shard_size)", optimizer_shard)
    return dp // optimizer_shard


def replica_group_of(
    rank: int, world_size: int, dp: int, tp: int = 1, pp: int = 1, optimizer_shard: int = 1
) -> list[int]:
    """The replica group containing ``rank`` (itself alone when there is no replica)."""
    validate_layout(world_size, dp, tp, pp, optimizer_shard)
    if not 0 <= rank < world_size:
        raise ReplicaConfigError(f"rank {rank} is outside 0..{world_size - 1}")
    stage_size = world_size // pp
    stage, q = divmod(rank, stage_size)
    stride = tp * optimizer_shard
    count = dp // optimizer_shard
    return [stage * stage_size + (q % stride) + j * stride for j in range(count)]


def replica_groups(world_size: int, dp: int, tp: int = 1, pp: int = 1, optimizer_shard: int = 1) -> list[list[int]]:
    """Every replica group once, ordered by its lowest rank; each group is sorted.

    With a replica count of 1 every group is a single rank; use ``require_replicas`` to
    refuse that.
    """
    validate_layout(world_size, dp, tp, pp, optimizer_shard)
    seen: set[int] = set()
    groups: list[list[int]] = []
    for rank in range(world_size):
        if rank in seen:
            continue
        group = replica_group_of(rank, world_size, dp, tp, pp, optimizer_shard)
        seen.update(group)
        groups.append(group)
    return groups


def require_replicas(
    world_size: int, dp: int, tp: int = 1, pp: int = 1, optimizer_shard: int = 1, *, minimum: int = MIN_REPLICAS
) -> list[list[int]]:
    """The replica groups, or ``ReplicaConfigError`` naming the setting to change when a group has < ``minimum``."""
    groups = replica_groups(world_size, dp, tp, pp, optimizer_shard)
    count = replica_count(dp, optimizer_shard)
    if count < minimum:
        if optimizer_shard > 1:
            advice = (
                f"raise dp to at least {minimum * optimizer_shard} (a multiple of optimizer_shard) or lower "
                f"optimizer_shard (optimizer_weight_shard_size) to {max(1, dp // minimum)} or less"
            )
        else:
            advice = f"set dp (data_parallel) to {minimum} or more (and tp/pp so that dp × tp × pp = {world_size})"
        raise ReplicaConfigError(
            f"high availability needs a replica relation: dp / optimizer_shard = {dp} / {optimizer_shard} = "
            f"{count} replica(s) of each rank's state, but MindIO TFT needs at least {minimum} (it restores a "
            f"failed rank from a replica); {advice}"
        )
    return groups


def format_groups(groups: list[list[int]], limit: int = 16) -> str:
    """``[0, 4] [1, 5] ...``, cut after ``limit`` groups with a count of the rest."""
    shown = " ".join(str(g) for g in groups[:limit])
    if len(groups) > limit:
        shown += f" ... ({len(groups) - limit} more, {len(groups)} groups in all)"
    return shown
