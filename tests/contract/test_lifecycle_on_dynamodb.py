"""The lifecycle coordinators against DynamoDB (moto server): child creation, cleanup and the auditor.

The deciders are covered in tests/unit; these tests show that the coordinators' reads and writes
mean the same on a real DynamoDB table as in memory.
"""

from __future__ import annotations

import pytest

from devtools.shard_lineage import LineageBuilder, shard_id
from lease_core.errors import LeaseLostError
from lease_core.lifecycle.lease_lifecycle import (
    CleanupOutcome,
    apply_cleanup,
    create_child_leases,
    parents_have_finished,
    plan_lease_cleanup,
)
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.model.shards import ChildShard, Shard
from lease_core.store.coordinator_state import CoordinatorStateStore
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.sync.audit import AuditReason, ShardSyncAuditor
from tests.support.faults import AnswerLostClient
from tests.support.stores import FAST_RETRIES, dynamodb_state_store, dynamodb_store, raw_item

S = shard_id
SINGLE = LeaseKeyScheme()
READING = ExtendedSequenceNumber("1500")
OWNER = "app-worker-0"


@pytest.fixture
def store(moto_endpoint: str, unique_name: str) -> DynamoDBLeaseStore:
    return dynamodb_store(moto_endpoint, unique_name)


@pytest.fixture
def state(store: DynamoDBLeaseStore, moto_endpoint: str, unique_name: str) -> CoordinatorStateStore:
    return dynamodb_state_store(moto_endpoint, unique_name)


def stored(store: DynamoDBLeaseStore, key: str) -> Lease:
    lease = store.get_lease(key, consistent=True)
    assert lease is not None, f"lease {key} should exist"
    return lease


def claimed(store: DynamoDBLeaseStore, lease: Lease, token: str = "attempt-0") -> Lease:
    """`lease`, created, assigned to a slot and claimed by one of its attempts: as its holder sees it."""
    assert store.create_lease_if_not_exists(lease)
    assigned = store.assign_lease(stored(store, lease.lease_key), OWNER).lease
    assert assigned is not None
    result = store.claim_lease(assigned, token)
    assert result.applied and result.lease is not None
    return result.lease


def split_children() -> list[ChildShard]:
    _, *child_shards = split_of_shard_0()
    return [ChildShard(s.shard_id, s.parent_shard_ids, s.hash_key_range) for s in child_shards]


def split_of_shard_0() -> list[Shard]:
    lineage = LineageBuilder(1)
    lineage.split(S(0))
    return lineage.shards()


def test_a_split_is_created_read_and_cleaned_up_on_dynamodb(store):
    parent_shard, *child_shards = split_of_shard_0()
    children = [ChildShard(s.shard_id, s.parent_shard_ids, s.hash_key_range) for s in child_shards]
    parent = claimed(store, Lease(S(0), checkpoint=READING, hash_key_range=parent_shard.hash_key_range))

    outcome = create_child_leases(store, parent, children, SINGLE)
    again = create_child_leases(store, parent, children, SINGLE)
    store.checkpoint(stored(store, S(0)), SHARD_END)

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


def test_a_holder_fenced_by_a_twin_attempt_creates_no_child_on_dynamodb(store):
    """Hole 2 of issue 13: the transaction's condition on the parent stops a stale holder."""
    stale = claimed(store, Lease(S(0), checkpoint=READING))
    assert store.claim_lease(stale, "attempt-1").applied  # the newer attempt of the slot took over
    with pytest.raises(LeaseLostError, match="claim attempt-1"):
        create_child_leases(store, stale, split_children(), SINGLE)
    assert [lease.lease_key for lease in store.list_leases()] == [S(0)]
    assert "childShardIds" not in raw_item(store, S(0))


def test_a_child_creation_whose_answer_was_lost_creates_each_child_once_on_dynamodb(store):
    parent = claimed(store, Lease(S(0), checkpoint=READING))
    lossy = AnswerLostClient(store.client, lambda name, number: name == "transact_write_items" and number == 1)
    lossy_store = DynamoDBLeaseStore(lossy, store.table_name, retry_policy=FAST_RETRIES)

    outcome = create_child_leases(lossy_store, parent, split_children(), SINGLE)

    assert sorted(outcome.created + outcome.existing) == [S(1), S(2)] and outcome.child_ids_recorded
    assert raw_item(store, S(0))["childShardIds"] == {"SS": [S(1), S(2)]}
    assert stored(store, S(0)).lease_counter == parent.lease_counter, "a child-id write leaves the counter"


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
    assert (record["consecutiveHoles"], record["updatedAt"]) == (0, 1700000000000)
    assert record["hole"] == decisions[-1].hole
