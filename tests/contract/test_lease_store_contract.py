"""One contract for every LeaseStore: the in-memory store and DynamoDB (moto server over HTTP).

Each test states one behaviour of docs/protocol.md §2.1-2.3 / §2.5 and must hold for both stores.
"""

from __future__ import annotations

import pytest

from lease_core.errors import CheckpointOrderError, CorruptLeaseError
from lease_core.model.lease import AgedOutRange, HashKeyRange, Lease, StreamIdentifier
from lease_core.model.sequence import LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.store import codec
from lease_core.store.lease_store import ConditionalLeaseStore, WriteResult
from lease_core.store.lease_writes import MetaField
from lease_core.store.memory_store import InMemoryLeaseStore
from tests.support.stores import dynamodb_store, put_raw_item, raw_item

ESN = ExtendedSequenceNumber


@pytest.fixture(params=["memory", "dynamodb"])
def store(request: pytest.FixtureRequest, unique_name: str) -> ConditionalLeaseStore:
    if request.param == "memory":
        return InMemoryLeaseStore()
    return dynamodb_store(request.getfixturevalue("moto_endpoint"), unique_name)


def stored(store: ConditionalLeaseStore, key: str) -> Lease:
    lease = store.get_lease(key, consistent=True)
    assert lease is not None, f"lease {key} should exist"
    return lease


def owned(store: ConditionalLeaseStore, key: str = "shardId-000000000000", owner: str = "worker-a", **fields) -> Lease:
    """Create a lease and have `owner` assigned to it; return the owner's fresh local copy."""
    assert store.create_lease_if_not_exists(Lease(key, checkpoint=TRIM_HORIZON, **fields))
    result = store.assign_lease(stored(store, key), owner)
    assert result.applied
    return result.lease


# --- create / get / delete ----------------------------------------------------------------------


def test_create_writes_the_full_kcl_item_with_kcl_names_and_types(store):
    lease = Lease(
        "shardId-000000000008",
        checkpoint=LATEST,
        parent_shard_ids={"shardId-000000000006", "shardId-000000000007"},
        hash_key_range=HashKeyRange(0, 399),
    )
    assert store.create_lease_if_not_exists(lease) is True
    assert raw_item(store, "shardId-000000000008") == {
        "leaseKey": {"S": "shardId-000000000008"},
        "leaseCounter": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": "LATEST"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "parentShardId": {"SS": ["shardId-000000000006", "shardId-000000000007"]},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": "399"},
        "entityType": {"S": "LEASE"},
    }


def test_create_of_an_existing_key_returns_false_and_keeps_the_stored_lease(store):
    store.create_lease_if_not_exists(Lease("shardId-1", checkpoint=LATEST))
    assert store.create_lease_if_not_exists(Lease("shardId-1", checkpoint=TRIM_HORIZON)) is False
    assert stored(store, "shardId-1").checkpoint == LATEST


def test_get_of_a_missing_key_returns_none(store):
    assert store.get_lease("shardId-404") is None


def test_get_skips_items_that_are_not_leases(store):
    put_raw_item(store, {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRIC_STATS"}})
    assert store.get_lease("worker-1") is None


def test_get_of_a_corrupt_item_names_the_key_and_the_attribute(store):
    put_raw_item(store, {"leaseKey": {"S": "shardId-9"}, "leaseCounter": {"S": "x"}, "checkpoint": {"S": "LATEST"}})
    with pytest.raises(CorruptLeaseError, match=r"shardId-9.*leaseCounter"):
        store.get_lease("shardId-9")


def test_delete_removes_the_lease_and_deleting_a_missing_lease_succeeds(store):
    store.create_lease_if_not_exists(Lease("shardId-1"))
    store.delete_lease("shardId-1")
    store.delete_lease("shardId-1")
    assert store.get_lease("shardId-1") is None


def test_a_conditional_delete_removes_a_lease_unchanged_since_it_was_read(store):
    lease = owned(store)
    result = store.delete_lease_if_unchanged(lease)
    assert result == WriteResult(True, None)
    assert store.get_lease(lease.lease_key, consistent=True) is None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda store, lease: store.renew_lease(lease), id="renewed"),
        pytest.param(lambda store, lease: store.assign_lease(lease, "worker-b"), id="assigned"),
        pytest.param(lambda store, lease: store.checkpoint(lease, ESN("42")), id="checkpointed"),
    ],
)
def test_a_conditional_delete_loses_against_a_lease_changed_after_the_snapshot(store, change):
    snapshot = owned(store)
    changed = change(store, snapshot).lease
    result = store.delete_lease_if_unchanged(snapshot)
    assert (result.applied, result.lost_to_a_change, result.lease) == (False, True, changed)
    assert stored(store, snapshot.lease_key) == changed


def test_a_conditional_delete_of_a_finished_lease_loses_when_its_checkpoint_moved_without_its_counter(store):
    # Writers other than ours (an operator's script, a KCL tool) may rewrite the checkpoint alone.
    snapshot = store.checkpoint(owned(store), SHARD_END).lease
    item = raw_item(store, snapshot.lease_key)
    put_raw_item(store, {**item, "checkpoint": {"S": "TRIM_HORIZON"}})
    result = store.delete_lease_if_unchanged(snapshot)
    assert result.lost_to_a_change and result.lease.checkpoint == TRIM_HORIZON
    assert stored(store, snapshot.lease_key).lease_counter == snapshot.lease_counter


def test_a_conditional_delete_of_a_missing_lease_is_not_applied_and_names_no_lease(store):
    result = store.delete_lease_if_unchanged(Lease("shardId-404", checkpoint=SHARD_END))
    assert (result.applied, result.lost_to_a_change, result.lease) == (False, False, None)


# --- scans and the owner index ------------------------------------------------------------------


def test_scan_returns_every_lease_and_reports_corrupt_items_apart(store):
    for n in range(7):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}"))
    put_raw_item(store, {"leaseKey": {"S": "shardId-bad"}, "leaseCounter": {"N": "1"}})
    put_raw_item(store, {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}})
    scan = store.scan_leases()
    assert sorted(lease.lease_key for lease in scan.leases) == [f"shardId-{n}" for n in range(7)]
    assert [(error.lease_key, "checkpoint" in error.problem) for error in scan.corrupt] == [("shardId-bad", True)]


def test_list_by_owner_returns_exactly_that_owners_leases(store):
    for n in range(5):
        owned(store, f"shardId-{n}", owner="worker-a" if n % 2 == 0 else "worker-b")
    assert [lease.lease_key for lease in store.list_leases_for_owner("worker-a")] == [
        "shardId-0",
        "shardId-2",
        "shardId-4",
    ]
    assert store.list_lease_keys_for_owner("worker-b") == ["shardId-1", "shardId-3"]
    assert store.list_leases_for_owner("worker-z") == []


def test_get_leases_reads_the_named_leases_that_exist_and_skips_what_is_not_a_readable_lease(store):
    for n in range(3):
        owned(store, f"shardId-{n}", owner="worker-a")
    put_raw_item(store, {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}})
    put_raw_item(store, {"leaseKey": {"S": "shardId-bad"}, "leaseCounter": {"N": "1"}})
    keys = ["shardId-2", "shardId-0", "shardId-0", "shardId-missing", "Leader", "shardId-bad"]
    assert [lease.lease_key for lease in store.get_leases(keys)] == ["shardId-0", "shardId-2"]
    assert store.get_leases([]) == []


def test_table_emptiness_ignores_non_lease_items(store):
    assert store.is_lease_table_empty()
    put_raw_item(store, {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}})
    assert store.is_lease_table_empty()
    store.create_lease_if_not_exists(Lease("shardId-1"))
    assert not store.is_lease_table_empty()


# --- renew --------------------------------------------------------------------------------------


def test_renew_adds_one_to_the_counter_and_stores_throughput_rounded_half_up(store):
    lease = owned(store)
    result = store.renew_lease(lease.replace(throughput_kbps=12.3456785))
    assert result.applied and result.lease.lease_counter == lease.lease_counter + 1
    assert raw_item(store, lease.lease_key)["throughputKBps"] == {"N": "12.345679"}


def test_renew_with_a_stale_counter_is_lost_and_returns_the_stored_lease(store):
    lease = owned(store)
    assert store.renew_lease(lease).applied
    result = store.renew_lease(lease)
    assert not result.applied and result.lease.lease_counter == lease.lease_counter + 1


def test_renew_of_a_deleted_lease_is_lost_with_no_stored_lease(store):
    lease = owned(store)
    store.delete_lease(lease.lease_key)
    assert store.renew_lease(lease) == WriteResult(False, None)


def test_renew_by_an_owner_unaware_of_a_handoff_is_lost_and_shows_the_handoff(store):
    lease = owned(store)
    assert store.initiate_graceful_handoff(lease, "worker-b").applied
    result = store.renew_lease(lease)
    assert not result.applied
    assert (result.lease.lease_owner, result.lease.checkpoint_owner) == ("worker-b", "worker-a")


def test_old_owner_adopts_a_handoff_and_keeps_renewing_as_checkpoint_owner(store):
    lease = owned(store)
    store.initiate_graceful_handoff(lease, "worker-b")
    seen = store.renew_lease(lease).lease
    adopted = lease.replace(lease_owner=seen.lease_owner, checkpoint_owner=seen.checkpoint_owner)
    result = store.renew_lease(adopted)
    assert result.applied and result.lease.lease_counter == lease.lease_counter + 1
    assert result.lease.checkpoint_owner == "worker-a"


# --- take / evict -------------------------------------------------------------------------------


def test_take_changes_owner_counts_a_switch_and_cancels_a_handoff(store):
    lease = owned(store)
    handoff = store.initiate_graceful_handoff(lease, "worker-b").lease
    result = store.take_lease(handoff, "worker-c")
    assert result.applied
    assert (result.lease.lease_owner, result.lease.checkpoint_owner) == ("worker-c", None)
    assert result.lease.lease_counter == lease.lease_counter + 1
    assert result.lease.owner_switches_since_checkpoint == lease.owner_switches_since_checkpoint + 1


def test_take_by_the_current_owner_counts_no_switch(store):
    lease = owned(store)
    result = store.take_lease(lease, "worker-a")
    assert result.applied and result.lease.owner_switches_since_checkpoint == lease.owner_switches_since_checkpoint


def test_take_with_a_stale_counter_is_lost(store):
    lease = owned(store)
    store.renew_lease(lease)
    assert not store.take_lease(lease, "worker-b").applied
    assert stored(store, lease.lease_key).lease_owner == "worker-a"


def test_evict_removes_the_owner_and_fences_it(store):
    lease = owned(store)
    result = store.evict_lease(lease)
    assert result.applied and result.lease.lease_owner is None
    assert result.lease.lease_counter == lease.lease_counter + 1
    assert not store.renew_lease(lease).applied


def test_evict_during_a_handoff_removes_only_the_checkpoint_owner(store):
    lease = owned(store)
    handoff = store.initiate_graceful_handoff(lease, "worker-b").lease
    result = store.evict_lease(handoff)
    assert result.applied
    assert (result.lease.lease_owner, result.lease.checkpoint_owner) == ("worker-b", None)


def test_evict_with_a_stale_owner_is_lost(store):
    lease = owned(store)
    store.assign_lease(lease, "worker-b")
    assert not store.evict_lease(lease).applied
    assert stored(store, lease.lease_key).lease_owner == "worker-b"


# --- update, checkpoint, prepare ----------------------------------------------------------------


def test_checkpoint_writes_the_value_clears_pending_and_zeroes_switches(store):
    lease = owned(store)
    prepared = store.prepare_checkpoint(lease, ESN("100"), b"files").lease
    result = store.checkpoint(prepared, ESN("100", 3))
    assert result.applied
    assert result.lease.checkpoint == ESN("100", 3)
    assert result.lease.pending_checkpoint is None and result.lease.pending_checkpoint_state is None
    assert result.lease.owner_switches_since_checkpoint == 0
    assert result.lease.lease_counter == lease.lease_counter + 2
    item = raw_item(store, lease.lease_key)
    assert item["checkpoint"] == {"S": "100"} and item["checkpointSubSequenceNumber"] == {"N": "3"}
    assert not {"pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState"} & item.keys()


def test_prepare_stores_the_pending_pair_and_binary_state_and_keeps_the_checkpoint(store):
    lease = owned(store)
    result = store.prepare_checkpoint(lease, ESN("2000", 1), b"\x00batch")
    assert result.applied and result.lease.checkpoint == TRIM_HORIZON
    item = raw_item(store, lease.lease_key)
    assert item["pendingCheckpoint"] == {"S": "2000"}
    assert item["pendingCheckpointSubSequenceNumber"] == {"N": "1"}
    assert bytes(item["pendingCheckpointState"]["B"]) == b"\x00batch"


def test_prepare_without_state_deletes_the_previous_state(store):
    lease = owned(store)
    first = store.prepare_checkpoint(lease, ESN("10"), b"old").lease
    result = store.prepare_checkpoint(first, ESN("20"))
    assert result.lease.pending_checkpoint == ESN("20") and result.lease.pending_checkpoint_state is None


def test_a_checkpoint_below_the_current_one_is_refused_before_any_write(store):
    lease = store.checkpoint(owned(store), ESN("500")).lease
    with pytest.raises(CheckpointOrderError, match="never move backwards"):
        store.checkpoint(lease, ESN("499"))
    assert stored(store, lease.lease_key).lease_counter == lease.lease_counter


def test_a_stale_owner_is_fenced_out_of_checkpoint_after_reassignment(store):
    lease = owned(store)
    assert store.renew_lease(lease).applied is True
    fresh = stored(store, lease.lease_key)
    assert store.assign_lease(fresh, "worker-b").applied
    assert not store.checkpoint(fresh, ESN("7")).applied
    assert stored(store, lease.lease_key).checkpoint == TRIM_HORIZON


def test_shard_end_checkpoint_and_child_ids_are_written_by_update(store):
    lease = owned(store)
    result = store.update_lease(lease.with_checkpoint(SHARD_END).with_child_shard_ids({"shardId-2", "shardId-3"}))
    assert result.applied and result.lease.is_at_shard_end
    assert raw_item(store, lease.lease_key)["childShardIds"] == {"SS": ["shardId-2", "shardId-3"]}


def test_multi_stream_leases_carry_stream_name_and_shard_id(store):
    stream = StreamIdentifier("123456789012", "orders", 1)
    assert store.create_lease_if_not_exists(Lease.for_stream(stream, "shardId-4"))
    item = raw_item(store, "123456789012:orders:1:shardId-4")
    assert item["streamName"] == {"S": "123456789012:orders:1"} and item["shardId"] == {"S": "shardId-4"}
    assert stored(store, "123456789012:orders:1:shardId-4").is_multi_stream


# --- assign and graceful handoff ----------------------------------------------------------------


def test_assign_succeeds_while_the_owner_renews_and_fences_its_next_renew(store):
    lease = owned(store)
    renewed = store.renew_lease(lease).lease
    assert store.assign_lease(lease, "worker-b").applied  # owner-conditional, not counter-conditional
    assert not store.renew_lease(renewed).applied


def test_assign_clears_the_checkpoint_owner_and_counts_a_switch(store):
    lease = owned(store)
    handoff = store.initiate_graceful_handoff(lease, "worker-b").lease
    result = store.assign_lease(handoff, "worker-c")
    assert result.applied and result.lease.checkpoint_owner is None
    assert result.lease.lease_owner == "worker-c"
    assert result.lease.lease_counter == handoff.lease_counter + 1
    assert result.lease.owner_switches_since_checkpoint == handoff.owner_switches_since_checkpoint + 1


def test_completing_a_handoff_to_the_recorded_owner_counts_no_switch(store):
    lease = owned(store)
    handoff = store.initiate_graceful_handoff(lease, "worker-b").lease
    result = store.assign_lease(handoff, "worker-b")
    assert result.lease.owner_switches_since_checkpoint == handoff.owner_switches_since_checkpoint
    assert result.lease.checkpoint_owner is None


def test_assigning_back_to_the_checkpoint_owner_counts_a_switch(store):
    lease = owned(store)
    handoff = store.initiate_graceful_handoff(lease, "worker-b").lease
    result = store.assign_lease(handoff, "worker-a")
    assert result.lease.owner_switches_since_checkpoint == handoff.owner_switches_since_checkpoint + 1


def test_assign_with_a_stale_owner_view_is_lost(store):
    lease = owned(store)
    assert store.assign_lease(lease, "worker-b").applied
    result = store.assign_lease(lease, "worker-c")
    assert not result.applied and result.lease.lease_owner == "worker-b"


def test_assign_of_a_deleted_lease_is_lost(store):
    lease = owned(store)
    store.delete_lease(lease.lease_key)
    result = store.assign_lease(lease, "worker-b")
    assert not result.applied and result.lease is None


def test_handoff_records_both_owners_without_touching_the_counter(store):
    lease = owned(store)
    result = store.initiate_graceful_handoff(lease, "worker-b")
    assert result.applied
    assert (result.lease.lease_owner, result.lease.checkpoint_owner) == ("worker-b", "worker-a")
    assert result.lease.lease_counter == lease.lease_counter


def test_a_second_handoff_from_a_stale_view_is_lost(store):
    lease = owned(store)
    store.initiate_graceful_handoff(lease, "worker-b")
    assert not store.initiate_graceful_handoff(lease, "worker-c").applied


def test_the_checkpoint_owner_may_still_checkpoint_during_a_handoff(store):
    lease = owned(store)
    store.initiate_graceful_handoff(lease, "worker-b")
    result = store.checkpoint(lease, ESN("42"))
    assert result.applied and result.lease.checkpoint == ESN("42")


# --- meta updates -------------------------------------------------------------------------------


def test_meta_update_writes_child_ids_without_touching_the_counter(store):
    lease = owned(store)
    store.renew_lease(lease)
    assert store.update_lease_meta(lease.with_child_shard_ids({"shardId-5"}), MetaField.CHILD_SHARDS)
    after = stored(store, lease.lease_key)
    assert after.child_shard_ids == {"shardId-5"} and after.lease_counter == lease.lease_counter + 1


def test_meta_update_writes_a_missing_hash_range(store):
    store.create_lease_if_not_exists(Lease("shardId-1"))
    lease = stored(store, "shardId-1").replace(hash_key_range=HashKeyRange(10, 20))
    assert store.update_lease_meta(lease, MetaField.HASH_KEY_RANGE)
    assert stored(store, "shardId-1").hash_key_range == HashKeyRange(10, 20)


def test_meta_update_of_a_missing_lease_returns_false(store):
    assert store.update_lease_meta(Lease("shardId-x", child_shard_ids={"c"}), MetaField.CHILD_SHARDS) is False
    assert store.get_lease("shardId-x") is None


# --- retention losses carried until a kept report names them ------------------------------------------

FIRST_GAP = AgedOutRange("5", "9", "2026-11-23T10:00:00+00:00")
SECOND_GAP = AgedOutRange("20", None, None)


def test_checkpoints_add_the_losses_they_move_past_to_the_leases_unreported_ones(store):
    lease = owned(store)
    prepared = store.update_lease(lease.with_pending_checkpoint(ESN("12")), frozenset({FIRST_GAP})).lease
    committed = store.update_lease(prepared.with_checkpoint(ESN("25")), frozenset({SECOND_GAP}))
    assert committed.applied
    assert (
        committed.lease.unreported_losses == {FIRST_GAP, SECOND_GAP} == stored(store, lease.lease_key).unreported_losses
    )
    ((kind, values),) = raw_item(store, lease.lease_key)["unreportedRetentionLosses"].items()
    assert (kind, set(values)) == ("SS", {FIRST_GAP.encode(), SECOND_GAP.encode()})


def test_forgetting_reported_losses_removes_exactly_them_and_leaves_the_counter(store):
    lease = owned(store)
    lease = store.update_lease(lease.with_checkpoint(ESN("25")), frozenset({FIRST_GAP, SECOND_GAP})).lease
    assert store.forget_reported_losses(lease.lease_key, frozenset({FIRST_GAP})) is True
    assert stored(store, lease.lease_key).unreported_losses == {SECOND_GAP}
    assert stored(store, lease.lease_key).lease_counter == lease.lease_counter
    # The holder's next write still holds (its condition is the counter), and adds nothing back.
    assert store.update_lease(lease.with_checkpoint(ESN("30"))).applied
    assert store.forget_reported_losses(lease.lease_key, frozenset({SECOND_GAP})) is True
    assert "unreportedRetentionLosses" not in raw_item(store, lease.lease_key)


def test_forgetting_losses_of_a_deleted_lease_writes_nothing(store):
    assert store.forget_reported_losses("shardId-gone", frozenset({FIRST_GAP})) is False
    assert store.get_lease("shardId-gone") is None


def test_cleanup_never_deletes_a_lease_that_carries_unreported_losses(store):
    lease = owned(store)
    ended = store.update_lease(lease.with_checkpoint(SHARD_END), frozenset({FIRST_GAP})).lease
    result = store.delete_lease_if_unchanged(ended)
    assert (result.applied, result.lost_to_a_change) == (False, True)
    assert store.forget_reported_losses(ended.lease_key, frozenset({FIRST_GAP}))
    assert store.delete_lease_if_unchanged(stored(store, ended.lease_key)).applied


def test_a_corrupt_unreported_loss_is_named_when_the_lease_is_read(store):
    put_raw_item(
        store,
        {
            "leaseKey": {"S": "shardId-1"},
            "leaseCounter": {"N": "1"},
            "checkpoint": {"S": "TRIM_HORIZON"},
            "unreportedRetentionLosses": {"SS": ["after 5"]},
        },
    )
    with pytest.raises(CorruptLeaseError, match="unreportedRetentionLosses"):
        store.get_lease("shardId-1", consistent=True)


# --- repairing an unreadable item (`leasectl repair`) ------------------------------------------

CORRUPT = {
    "leaseKey": {"S": "shardId-7"},
    "leaseCounter": {"N": "12"},
    "leaseOwner": {"S": "app-worker-1"},
    "checkpoint": {"N": "49590338271490256608559692538361571095921575989136588898"},  # a number, not a string
    "parentShardId": {"SS": ["shardId-3"]},
    "throughputKBps": {"S": "fast"},  # not a number either
    "pendingCheckpoint": {"S": "LATEST"},
}


def test_a_repair_writes_the_position_keeps_what_reads_drops_what_does_not_and_fences_the_counter(store):
    put_raw_item(store, CORRUPT)
    target = ESN("49590338271490256608559692538361571095921575989136588898")
    result = store.repair_lease("shardId-7", target)
    assert result is not None and result.write is not None and result.write.applied
    assert result.problem is not None and result.problem.attribute == "checkpoint"
    assert result.dropped == ("throughputKBps",)
    repaired = stored(store, "shardId-7")
    assert (repaired.checkpoint, repaired.pending_checkpoint, repaired.lease_owner) == (target, None, None)
    assert (repaired.lease_counter, repaired.parent_shard_ids) == (14, frozenset({"shardId-3"}))
    assert set(raw_item(store, "shardId-7")) == set(codec.lease_to_item(repaired))


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        pytest.param(
            {"leaseKey": {"S": "shardId-8"}, "leaseCounter": {"N": "3"}, "checkpoint": {"S": "LATEST"}},
            "readable",
            id="readable-lease",
        ),
        pytest.param(None, "missing", id="no-item"),
    ],
)
def test_a_repair_writes_nothing_over_a_readable_lease_or_where_there_is_no_item(store, item, expected):
    if item is not None:
        put_raw_item(store, item)
    result = store.repair_lease("shardId-8", TRIM_HORIZON)
    assert ("missing" if result is None else "readable" if result.problem is None else "repaired") == expected
    if item is not None:
        assert raw_item(store, "shardId-8") == item


def test_a_repair_loses_to_anyone_who_changed_the_item_after_it_was_read(store, monkeypatch):
    put_raw_item(store, CORRUPT)
    read = store._get_item

    def read_then_changed_by_someone_else(lease_key, consistent):
        item = read(lease_key, consistent)
        put_raw_item(store, {**CORRUPT, "leaseCounter": {"N": "13"}})
        return item

    monkeypatch.setattr(store, "_get_item", read_then_changed_by_someone_else)
    result = store.repair_lease("shardId-7", TRIM_HORIZON)
    assert result is not None and result.write is not None and not result.write.applied
    assert raw_item(store, "shardId-7")["leaseCounter"] == {"N": "13"}


def test_a_repair_keeps_a_checkpoint_that_reads_and_an_attribute_it_does_not_know(store):
    item = {
        "leaseKey": {"S": "shardId-5"},
        "leaseCounter": {"S": "seven"},
        "checkpoint": {"S": "4960"},
        "operatorNote": {"S": "moved by hand"},
    }
    put_raw_item(store, item)
    result = store.repair_lease("shardId-5", None)
    assert result is not None and result.write is not None and result.write.applied
    assert (stored(store, "shardId-5").checkpoint, stored(store, "shardId-5").lease_counter) == (ESN("4960"), 1)
    assert raw_item(store, "shardId-5")["operatorNote"] == {"S": "moved by hand"}


@pytest.mark.parametrize(
    ("item", "target", "refusal"),
    [
        pytest.param(
            {"leaseKey": {"S": "shardId-6"}, "leaseCounter": {"S": "x"}, "checkpoint": {"S": "SHARD_END"}},
            TRIM_HORIZON,
            "a finished shard stays finished",
            id="finished-shard-moved",
        ),
        pytest.param(
            {"leaseKey": {"S": "shardId-6"}, "leaseCounter": {"N": "2"}, "checkpoint": {"N": "5"}},
            None,
            "give the position",
            id="no-checkpoint-to-keep",
        ),
        pytest.param(
            {
                "leaseKey": {"S": "shardId-6"},
                "leaseCounter": {"N": "2"},
                "checkpoint": {"S": "5"},
                "parentShardId": {"S": "shardId-1"},
            },
            None,
            "never drops it",
            id="parents-unreadable",
        ),
    ],
)
def test_a_repair_that_would_need_a_guess_is_refused_writing_nothing(store, item, target, refusal):
    put_raw_item(store, item)
    with pytest.raises(codec.RepairRefused, match=refusal):
        store.repair_lease("shardId-6", target)
    assert raw_item(store, "shardId-6") == item


def test_a_repair_of_a_finished_shard_keeps_it_finished(store):
    put_raw_item(store, {"leaseKey": {"S": "shardId-4"}, "leaseCounter": {"S": "x"}, "checkpoint": {"S": "SHARD_END"}})
    result = store.repair_lease("shardId-4", None)
    assert result is not None and result.write is not None and result.write.applied
    assert stored(store, "shardId-4").checkpoint == SHARD_END


def test_an_item_that_is_not_a_lease_is_never_made_one(store):
    put_raw_item(store, {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRIC_STATS"}})
    assert store.repair_lease("worker-1", TRIM_HORIZON) is None
