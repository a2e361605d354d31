"""MindIO TFT replica groups (graceful_exit.md §2.2): the documented tables and the refusals."""

from __future__ import annotations

import pytest

from launchers.elastic.replicas import (
    ReplicaConfigError,
    format_groups,
    replica_count,
    replica_group_of,
    replica_groups,
    require_replicas,
)

PAIRS_OF_8 = [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_dp2_tp4_matches_the_redundancy_of_mindspore_layouts() -> None:
    # dev_matrix [2, 4], tensor_map [-1, 0] → ((0,4),(1,5),(2,6),(3,7)) (reference §2.1)
    assert replica_groups(8, dp=2, tp=4) == PAIRS_OF_8


def test_dp8_with_optimizer_shard_4_matches_the_documented_report_group_list() -> None:
    # MindFormers docs: 8 ranks, data_parallel 8, optimizer_weight_shard_size 4 → [0,4] [1,5] [2,6] [3,7]
    assert replica_groups(8, dp=8, tp=1, optimizer_shard=4) == PAIRS_OF_8
    assert replica_count(8, 4) == 2


def test_pipeline_stages_are_offset_by_the_stage_size() -> None:
    groups = replica_groups(16, dp=2, tp=4, pp=2)
    assert groups == [*PAIRS_OF_8, [8, 12], [9, 13], [10, 14], [11, 15]]


def test_pure_data_parallel_is_one_group_of_every_rank() -> None:
    assert replica_groups(4, dp=4) == [[0, 1, 2, 3]]


def test_dp4_shard2_has_two_replicas() -> None:
    assert require_replicas(8, dp=4, tp=2, optimizer_shard=2) == PAIRS_OF_8


def test_every_rank_is_in_exactly_one_group_and_every_member_agrees() -> None:
    for world, dp, tp, pp, k in [(8, 2, 4, 1, 1), (16, 4, 2, 2, 2), (24, 6, 2, 2, 3), (32, 8, 1, 4, 2)]:
        groups = replica_groups(world, dp, tp, pp, k)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(world))
        for group in groups:
            assert len(group) == dp // k
            for member in group:
                assert replica_group_of(member, world, dp, tp, pp, k) == group


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"world_size": 8, "dp": 1, "tp": 8}, ["dp (data_parallel)", "set dp"]),
        ({"world_size": 8, "dp": 2, "tp": 4, "optimizer_shard": 2}, ["raise dp to at least 4", "optimizer_shard"]),
    ],
)
def test_a_replica_count_below_two_is_refused_naming_the_setting(kwargs: dict[str, int], names: list[str]) -> None:
    with pytest.raises(ReplicaConfigError) as err:
        require_replicas(**kwargs)
    message = str(err.value)
    assert "= 1 replica" in message
    for name in names:
        assert name in message


def test_a_layout_that_does_not_multiply_to_the_world_size_is_refused() -> None:
    with pytest.raises(ReplicaConfigError, match=r"dp × tp × pp = 2 × 2 × 1 = 4, but the job runs 8 processes"):
        replica_groups(8, dp=2, tp=2)


def test_a_shard_that_does_not_divide_dp_is_refused() -> None:
    with pytest.raises(ReplicaConfigError, match="does not divide dp = 6"):
        replica_groups(6, dp=6, optimizer_shard=4)


def test_zero_or_negative_sizes_are_refused() -> None:
    with pytest.raises(ReplicaConfigError, match="tp"):
        replica_groups(8, dp=8, tp=0)


def test_format_groups_cuts_long_lists() -> None:
    groups = replica_groups(64, dp=2, tp=32)
    text = format_groups(groups, limit=3)
    assert text.startswith("[0, 32] [1, 33] [2, 34] ...")
    assert "29 more, 32 groups in all" in text
