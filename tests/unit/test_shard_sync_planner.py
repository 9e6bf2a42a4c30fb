"""ShardSyncPlanner: KCL's lease choices for empty and non-empty lease tables (docs/protocol.md §3.3-3.6)."""

from __future__ import annotations

import pytest

from devtools.shard_lineage import LineageBuilder, shard_id
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, TRIM_HORIZON
from lease_core.model.shards import InitialPosition, Shard
from lease_core.sync.planner import (
    LeaseKeyScheme,
    inconsistent_shards,
    plan_for_empty_table,
    plan_for_existing_leases,
)
from tests.support.seed_lineage import seed_lineage

S = shard_id


def planned(leases: list[Lease]) -> list[tuple[str, str]]:
    return [(lease.lease_key, lease.checkpoint.sequence_number) for lease in leases]


@pytest.mark.parametrize(
    ("initial_position", "expected"),
    [
        pytest.param(InitialPosition.LATEST, [(S(6), "LATEST")], id="latest-creates-6"),
        pytest.param(
            InitialPosition.TRIM_HORIZON,
            [(S(0), "TRIM_HORIZON"), (S(1), "TRIM_HORIZON")],
            id="trim-horizon-creates-0-and-1",
        ),
        pytest.param(
            InitialPosition.AT_TIMESTAMP,
            [(S(0), "AT_TIMESTAMP"), (S(1), "AT_TIMESTAMP")],
            id="at-timestamp-creates-0-and-1",
        ),
    ],
)
def test_the_seed_example_with_leases_4_5_7_present(initial_position, expected):
    plan = plan_for_existing_leases(seed_lineage(), {S(4), S(5), S(7)}, initial_position)
    assert planned(plan) == expected


@pytest.mark.parametrize(
    ("leased", "initial_position", "expected"),
    [
        pytest.param(
            set(),
            InitialPosition.LATEST,
            [(S(4), "LATEST"), (S(8), "LATEST"), (S(9), "LATEST"), (S(10), "LATEST")],
            id="no-leases-latest-takes-open-shards",
        ),
        pytest.param(
            set(),
            InitialPosition.TRIM_HORIZON,
            [
                (S(0), "TRIM_HORIZON"),
                (S(1), "TRIM_HORIZON"),
                (S(2), "TRIM_HORIZON"),
                (S(3), "TRIM_HORIZON"),
                (S(4), "TRIM_HORIZON"),
                (S(5), "TRIM_HORIZON"),
            ],
            id="no-leases-trim-horizon-takes-roots",
        ),
        pytest.param({S(8), S(4), S(9), S(10)}, InitialPosition.TRIM_HORIZON, [], id="every-open-shard-leased"),
        pytest.param(
            {S(6)},
            InitialPosition.LATEST,
            [(S(7), "LATEST"), (S(4), "LATEST"), (S(9), "LATEST"), (S(10), "LATEST")],
            id="leased-6-latest-sibling-parent-7",
        ),
        pytest.param(
            {S(6)},
            InitialPosition.TRIM_HORIZON,
            [(S(2), "TRIM_HORIZON"), (S(3), "TRIM_HORIZON"), (S(4), "TRIM_HORIZON"), (S(5), "TRIM_HORIZON")],
            id="leased-6-trim-horizon-roots-of-7",
        ),
        pytest.param(
            {S(0), S(1), S(2), S(3), S(4), S(5)}, InitialPosition.LATEST, [], id="all-roots-leased-children-wait"
        ),
    ],
)
def test_non_empty_table_choices(leased, initial_position, expected):
    assert sorted(planned(plan_for_existing_leases(seed_lineage(), leased, initial_position))) == sorted(expected)


def test_planned_leases_carry_parents_and_hash_range_of_their_shard():
    shards = {shard.shard_id: shard for shard in seed_lineage()}
    (lease,) = plan_for_existing_leases(seed_lineage(), {S(4), S(5), S(7)}, InitialPosition.LATEST)
    assert lease.parent_shard_ids == {S(0), S(1)}
    assert lease.hash_key_range == shards[S(6)].hash_key_range
    assert (lease.lease_owner, lease.lease_counter, lease.owner_switches_since_checkpoint) == (None, 0, 0)


def test_grandchildren_of_a_leased_shard_wait_for_their_parents_shard_end():
    lineage = LineageBuilder(2)
    low, _high = lineage.split(S(0))
    lineage.split(low)
    # Shard 0 is leased: its children (2, 3) and grandchildren (4, 5) get leases only at SHARD_END.
    assert plan_for_existing_leases(lineage.shards(), {S(0), S(1)}, InitialPosition.TRIM_HORIZON) == []
    assert plan_for_existing_leases(lineage.shards(), {S(0), S(1)}, InitialPosition.LATEST) == []


def test_empty_table_gets_one_lease_per_listed_shard_at_the_initial_position_parents_first():
    plan = plan_for_empty_table(seed_lineage(), InitialPosition.TRIM_HORIZON)
    assert [lease.lease_key for lease in plan] == [S(n) for n in range(11)]
    assert {lease.checkpoint for lease in plan} == {TRIM_HORIZON}
    assert next(lease for lease in plan if lease.lease_key == S(8)).parent_shard_ids == {S(6), S(7)}


def test_empty_table_listing_with_only_open_shards_under_latest():
    open_shards = [shard for shard in seed_lineage() if shard.is_open]
    plan = plan_for_empty_table(open_shards, InitialPosition.LATEST)
    assert planned(plan) == [(S(4), "LATEST"), (S(8), "LATEST"), (S(9), "LATEST"), (S(10), "LATEST")]
    assert next(lease for lease in plan if lease.lease_key == S(9)).parent_shard_ids == {S(5)}


def test_leases_are_created_parents_first_by_starting_sequence_number():
    plan = plan_for_existing_leases(seed_lineage(), set(), InitialPosition.TRIM_HORIZON)
    starts = {shard.shard_id: int(shard.starting_sequence_number) for shard in seed_lineage()}
    assert [starts[lease.lease_key] for lease in plan] == sorted(starts[lease.lease_key] for lease in plan)


def test_trimmed_parents_are_ignored_and_the_child_is_a_root():
    trimmed = [shard for shard in seed_lineage() if shard.shard_id not in {S(0), S(1), S(2), S(3), S(6), S(7)}]
    plan = plan_for_existing_leases(trimmed, {S(4)}, InitialPosition.TRIM_HORIZON)
    assert planned(plan) == [(S(5), "TRIM_HORIZON"), (S(8), "TRIM_HORIZON")]


@pytest.mark.parametrize("initial_position", list(InitialPosition), ids=lambda position: position.name)
def test_a_leased_parent_missing_from_a_partial_listing_still_makes_its_children_wait(initial_position):
    partial = [
        shard for shard in seed_lineage() if shard.shard_id != S(5)
    ]  # 5 is leased and closed: 9, 10 split from it
    plan = plan_for_existing_leases(partial, {S(4), S(5), S(8)}, initial_position)
    assert planned(plan) == []


def open_parent_lineage() -> list[Shard]:
    shards = seed_lineage()
    # Shard 5 still open although its children 9 and 10 exist: what §3.3 calls inconsistent.
    return [
        Shard(
            s.shard_id,
            s.hash_key_range,
            s.starting_sequence_number,
            s.parent_shard_id,
            s.adjacent_parent_shard_id,
            None if s.shard_id == S(5) else s.ending_sequence_number,
        )
        for s in shards
    ]


def test_children_of_an_open_parent_are_inconsistent():
    assert inconsistent_shards(open_parent_lineage()) == {S(9), S(10)}
    assert inconsistent_shards(seed_lineage()) == frozenset()


def test_ignored_inconsistent_children_get_no_lease():
    plan = plan_for_existing_leases(
        open_parent_lineage(), {S(4), S(8)}, InitialPosition.LATEST, skipped_shard_ids={S(9), S(10)}
    )
    assert planned(plan) == [(S(5), "LATEST")]


def test_multi_stream_plans_carry_stream_keys_and_attributes():
    stream = StreamIdentifier("123456789012", "orders", 1700000000)
    scheme = LeaseKeyScheme(stream)
    (lease,) = plan_for_existing_leases(seed_lineage(), {S(4), S(5), S(7)}, InitialPosition.LATEST, scheme=scheme)
    assert lease.lease_key == f"123456789012:orders:1700000000:{S(6)}"
    assert (lease.stream_name, lease.shard_id) == ("123456789012:orders:1700000000", S(6))
    assert lease.parent_shard_ids == {S(0), S(1)}, "parent ids stay bare shard ids"


def test_initial_position_sentinels():
    assert [p.checkpoint for p in InitialPosition] == [TRIM_HORIZON, LATEST, AT_TIMESTAMP]


def test_a_lineage_deeper_than_the_recursion_limit_is_planned():
    lineage = LineageBuilder(1)
    current = S(0)
    for _ in range(1500):  # split and merge back, 3,000 generations
        low, high = lineage.split(current)
        current = lineage.merge(low, high)
    plan = plan_for_existing_leases(lineage.shards(), set(), InitialPosition.TRIM_HORIZON)
    assert planned(plan) == [(S(0), "TRIM_HORIZON")]
    assert plan_for_existing_leases(lineage.shards(), set(), InitialPosition.LATEST)[0].lease_key == current
