"""The pure parts of shard listing: hash-space tiling, children of a shard, ShardFilter, account ids."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from lease_core.model.lease import MAX_HASH_KEY, HashKeyRange
from lease_core.model.shards import InitialPosition, InitialPositionInStream, Shard
from lease_core.retrieval.shard_source import account_id_of, child_shards_of, hash_space_gap, shard_filter

HALF = 2**127


def shard(shard_id: str, start: int, end: int, parent: str | None = None, adjacent: str | None = None) -> Shard:
    return Shard(shard_id, HashKeyRange(start, end), "1", parent_shard_id=parent, adjacent_parent_shard_id=adjacent)


@pytest.mark.parametrize(
    ("shards", "expected"),
    [
        pytest.param([shard("a", 0, MAX_HASH_KEY)], None, id="one-shard-covering-everything"),
        pytest.param(
            [shard("c", HALF + 10, MAX_HASH_KEY), shard("a", 0, HALF - 1), shard("b", HALF, HALF + 9)],
            None,
            id="adjacent-shards-listed-out-of-hash-order",
        ),
        pytest.param([], "no shards were listed", id="empty"),
        pytest.param(
            [shard("a", 5, MAX_HASH_KEY)], "hash keys 0..4 before a are not covered", id="does-not-start-at-zero"
        ),
        pytest.param(
            [shard("a", 0, HALF)],
            f"hash keys {HALF + 1}..{MAX_HASH_KEY} after a are not covered",
            id="does-not-reach-the-maximum",
        ),
        pytest.param(
            [shard("a", 0, 99), shard("b", 200, MAX_HASH_KEY)],
            "hash keys 100..199 between a and b are not covered",
            id="hole-in-the-middle",
        ),
        pytest.param(
            [shard("a", 0, HALF), shard("b", HALF - 5, MAX_HASH_KEY)],
            f"a and b overlap on hash keys {HALF - 5}..{HALF}",
            id="overlap",
        ),
        pytest.param(
            [shard("parent", 0, MAX_HASH_KEY), shard("low", 0, HALF - 1), shard("high", HALF, MAX_HASH_KEY)],
            f"parent and low overlap on hash keys 0..{HALF - 1}",
            id="parent-listed-with-its-children",
        ),
        pytest.param(
            [shard("a", 0, 99), shard("b", 200, 299), shard("c", 250, MAX_HASH_KEY)],
            "hash keys 100..199 between a and b are not covered",
            id="first-problem-wins",
        ),
    ],
)
def test_hash_space_gap_names_the_first_hole_or_overlap(shards: list[Shard], expected: str | None) -> None:
    assert hash_space_gap(shards) == expected


LINEAGE = [
    shard("s0", 0, 99),
    shard("s1", 100, 199),
    shard("s2", 200, MAX_HASH_KEY),
    shard("s3", 0, 199, parent="s0", adjacent="s1"),
    shard("s4", 200, 299, parent="s2"),
    shard("s5", 300, MAX_HASH_KEY, parent="s2"),
]


@pytest.mark.parametrize(
    ("shard_id", "children"),
    [
        pytest.param("s0", ["s3"], id="merge-child-through-its-parent"),
        pytest.param("s1", ["s3"], id="merge-child-through-its-adjacent-parent"),
        pytest.param("s2", ["s4", "s5"], id="both-split-children-in-listing-order"),
        pytest.param("s3", [], id="open-shard-has-none"),
        pytest.param("unknown", [], id="unknown-shard-has-none"),
    ],
)
def test_child_shards_of_finds_shards_naming_it_as_a_parent(shard_id: str, children: list[str]) -> None:
    assert [child.shard_id for child in child_shards_of(LINEAGE, shard_id)] == children


MOMENT = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("initial_position", "expected"),
    [
        pytest.param(InitialPositionInStream(InitialPosition.LATEST), {"Type": "AT_LATEST"}, id="LATEST"),
        pytest.param(
            InitialPositionInStream(InitialPosition.TRIM_HORIZON), {"Type": "AT_TRIM_HORIZON"}, id="TRIM_HORIZON"
        ),
        pytest.param(
            InitialPositionInStream(InitialPosition.AT_TIMESTAMP, MOMENT),
            {"Type": "AT_TIMESTAMP", "Timestamp": MOMENT},
            id="AT_TIMESTAMP-carries-the-timestamp",
        ),
    ],
)
def test_the_shard_filter_follows_the_initial_position(
    initial_position: InitialPositionInStream, expected: dict[str, object]
) -> None:
    assert shard_filter(initial_position) == expected


@pytest.mark.parametrize(
    ("arn", "account_id"),
    [
        pytest.param("arn:aws:kinesis:us-east-1:123456789012:stream/orders", "123456789012", id="aws"),
        pytest.param("arn:aws-cn:kinesis:cn-north-1:000000000000:stream/orders", "000000000000", id="other-partition"),
    ],
)
def test_the_account_id_comes_from_the_stream_arn(arn: str, account_id: str) -> None:
    assert account_id_of(arn) == account_id


def test_a_string_that_is_not_an_arn_is_refused() -> None:
    with pytest.raises(ValueError, match="not a stream ARN"):
        account_id_of("orders")
