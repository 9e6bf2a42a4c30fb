"""The lifecycle coordinators against DynamoDB (moto server): child creation, cleanup and the auditor.

The deciders are covered in tests/unit; these tests show that the coordinators' reads and writes
mean the same on a real DynamoDB table as in memory.
"""

from __future__ import annotations

import pytest

from lease_core.coordinator_state import DynamoDBCoordinatorStateStore
from lease_core.dynamodb_store import DynamoDBLeaseStore
from lease_core.lease import Lease
from lease_core.lease_lifecycle import (
    CleanupOutcome,
    apply_cleanup,
    create_child_leases,
    parents_have_finished,
    plan_lease_cleanup,
)
from lease_core.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.shard_audit import AuditReason, ShardSyncAuditor
from lease_core.shard_sync import LeaseKeyScheme
from lease_core.shards import ChildShard, Shard
from tests.support.lineage import LineageBuilder, shard_id
from tests.support.stores import FAST_RETRIES, dynamodb_store, raw_item

S = shard_id
SINGLE = LeaseKeyScheme()
READING = ExtendedSequenceNumber("1500")


@pytest.fixture
def store(moto_endpoint: str, unique_name: str) -> DynamoDBLeaseStore:
    return dynamodb_store(moto_endpoint, unique_name)


@pytest.fixture
def state(store: DynamoDBLeaseStore, unique_name: str) -> DynamoDBCoordinatorStateStore:
    return DynamoDBCoordinatorStateStore(store.client, f"{unique_name}-CoordinatorState", retry_policy=FAST_RETRIES)


def stored(store: DynamoDBLeaseStore, key: str) -> Lease:
    lease = store.get_lease(key, consistent=True)
    assert lease is not None, f"lease {key} should exist"
    return lease


def split_of_shard_0() -> list[Shard]:
    lineage = LineageBuilder(1)
    lineage.split(S(0))
    return lineage.shards()


def test_a_split_is_created_read_and_cleaned_up_on_dynamodb(store):
    parent_shard, *child_shards = split_of_shard_0()
    children = [ChildShard(s.shard_id, s.parent_shard_ids, s.hash_key_range) for s in child_shards]
    assert store.create_lease_if_not_exists(Lease(S(0), checkpoint=READING, hash_key_range=parent_shard.hash_key_range))
    parent = store.checkpoint(stored(store, S(0)), SHARD_END).lease

    outcome = create_child_leases(store, parent, children, SINGLE)
    again = create_child_leases(store, parent, children, SINGLE)

    assert (outcome.created, again.created, again.existing) == ((S(1), S(2)), (), (S(1), S(2)))
    assert raw_item(store, S(0))["childShardIds"] == {"SS": [S(1), S(2)]}
    assert raw_item(store, S(1))["checkpoint"] == {"S": "TRIM_HORIZON"}
    assert parents_have_finished(store, stored(store, S(1)), SINGLE)

    shards = [parent_shard, *child_shards]
    first = apply_cleanup(store, plan_lease_cleanup(store.list_leases(), shards, SINGLE))
    for child in children:
        store.checkpoint(stored(store, child.shard_id), READING)
    second = apply_cleanup(store, plan_lease_cleanup(store.list_leases(), shards, SINGLE))

    assert (first, second) == (CleanupOutcome(), CleanupOutcome(completed_deleted=1, deleted=(S(0),)))
    assert store.get_lease(S(0), consistent=True) is None


def test_cleanup_records_listed_children_and_deletes_only_the_lease_kinesis_says_is_gone_on_dynamodb(store):
    shards = split_of_shard_0()
    store.create_lease_if_not_exists(Lease(S(0), checkpoint=SHARD_END))
    store.create_lease_if_not_exists(Lease(S(1), checkpoint=TRIM_HORIZON, parent_shard_ids={S(0)}))
    store.create_lease_if_not_exists(Lease(S(7), checkpoint=READING))
    store.create_lease_if_not_exists(Lease(S(8), checkpoint=READING))
    answers = {S(7): False, S(8): True}

    outcome = apply_cleanup(store, plan_lease_cleanup(store.list_leases(), shards, SINGLE, shard_exists=answers))

    assert outcome == CleanupOutcome(
        child_ids_recorded=1, garbage_deleted=1, possibly_unread=(S(7),), deleted=(S(7),), unlisted_existing=(S(8),)
    )
    assert raw_item(store, S(0))["childShardIds"] == {"SS": [S(1), S(2)]}
    assert store.get_lease(S(7), consistent=True) is None
    assert store.get_lease(S(8), consistent=True) is not None


def test_the_auditor_fills_ranges_and_persists_its_count_on_dynamodb(store, state):
    shards = LineageBuilder(4).shards()
    for shard in shards[:3]:  # the last quarter has no lease: a hole at the end
        store.create_lease_if_not_exists(Lease(shard.shard_id, checkpoint=READING))
    auditor = ShardSyncAuditor(store, state, clock_millis=lambda: 1_700_000_000_000)

    decisions = [auditor.audit("orders", SINGLE, lambda: shards, threshold=3) for _ in range(3)]

    assert [(d.reason, d.consecutive_holes) for d in decisions] == [
        (AuditReason.HOLE_UNCONFIRMED, 1),
        (AuditReason.HOLE_UNCONFIRMED, 2),
        (AuditReason.HOLE_CONFIRMED, 3),
    ]
    assert raw_item(store, S(1))["startingHashKey"] == {"S": str(shards[1].hash_key_range.starting_hash_key)}
    record = state.get("ShardSyncAuditor:orders")
    assert (record["consecutiveHoles"], record["updatedAt"]) == ({"N": "0"}, {"N": "1700000000000"})
    assert record["hole"] == {"S": decisions[-1].hole}
