"""Resetting a checkpoint under the leader lock, on both stores: the write, its retry, and whom it fences."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from lease_core.errors import LeadershipUnavailableError, LeaseLostError
from lease_core.leader.leader_lock import LEADER_KEY, LeaderLock
from lease_core.lifecycle.lease_holder import HeldLease
from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.model.pending_batch import PendingBatch
from lease_core.model.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from lease_core.ops.checkpoint_reset import (
    CheckpointReset,
    CheckpointResetError,
    Direction,
    LeaseNotFoundError,
    LeaseSelector,
)
from lease_core.store.coordinator_state import (
    CoordinatorStateStore,
    InMemoryCoordinatorStateStore,
)
from lease_core.store.lease_store import ConditionalLeaseStore, WriteResult
from lease_core.store.memory_store import InMemoryLeaseStore
from tests.support.stores import dynamodb_state_store, dynamodb_store, raw_item

ESN = ExtendedSequenceNumber
KEY = "shardId-000000000000"
OWNER = "app-worker-0"
PENDING_FIELDS = ("pendingCheckpoint", "pendingCheckpointSubSequenceNumber", "pendingCheckpointState")


@dataclass
class Tables:
    store: ConditionalLeaseStore
    state: CoordinatorStateStore

    def lock(self, owner: str = "leasectl-reset/host/1") -> LeaderLock:
        return LeaderLock(self.state, owner)

    def reset(self, target: ESN, selector: LeaseSelector = LeaseSelector(KEY), store=None):
        return CheckpointReset(store or self.store, self.lock()).run(selector, target)

    def stored(self, key: str = KEY) -> Lease:
        lease = self.store.get_lease(key, consistent=True)
        assert lease is not None
        return lease


@pytest.fixture(params=["memory", "dynamodb"])
def tables(request: pytest.FixtureRequest, unique_name: str) -> Tables:
    if request.param == "memory":
        return Tables(InMemoryLeaseStore(), InMemoryCoordinatorStateStore())
    endpoint = request.getfixturevalue("moto_endpoint")
    store = dynamodb_store(endpoint, unique_name)
    return Tables(store, dynamodb_state_store(endpoint, unique_name))


def owned(tables: Tables, checkpoint: ESN = ExtendedSequenceNumber("500"), lease: Lease | None = None) -> Lease:
    """A lease assigned to OWNER at `checkpoint`, with throughput on record; the owner's fresh copy."""
    lease = lease or Lease(KEY, checkpoint=checkpoint)
    assert tables.store.create_lease_if_not_exists(lease)
    assigned = tables.store.assign_lease(tables.stored(lease.lease_key), OWNER)
    assert assigned.applied and assigned.lease is not None
    renewed = tables.store.renew_lease(assigned.lease.replace(throughput_kbps=12.5))
    assert renewed.applied and renewed.lease is not None
    return renewed.lease


def with_prepared_batch(tables: Tables, lease: Lease, end: ESN) -> tuple[Lease, PendingBatch]:
    batch = PendingBatch(
        lease.checkpoint, end, None, f"stream_name=s/shard_id={KEY}/{lease.checkpoint}_{end}.parquet", 30
    )
    result = tables.store.prepare_checkpoint(lease, end, batch.encode())
    assert result.applied and result.lease is not None
    return result.lease, batch


def test_a_reset_rewrites_the_checkpoint_removes_the_pending_fields_and_raises_the_counter(tables):
    lease, batch = with_prepared_batch(tables, owned(tables), ESN("800"))
    report = tables.reset(ESN("100", 2))
    item = raw_item(tables.store, KEY)
    assert item is not None
    assert (item["checkpoint"], item["checkpointSubSequenceNumber"]) == ({"S": "100"}, {"N": "2"})
    assert item["leaseCounter"] == {"N": str(lease.lease_counter + 2)}
    assert not set(PENDING_FIELDS) & set(item)
    assert (item["leaseOwner"], item["throughputKBps"], item["ownerSwitchesSinceCheckpoint"]) == (
        {"S": OWNER},
        {"N": "12.500000"},
        {"N": "0"},
    )
    assert (report.plan.before, report.after, report.attempts) == (lease, tables.stored(), 1)
    assert report.plan.direction is Direction.BACKWARD
    assert report.plan.discarded is not None and report.plan.discarded.batch == batch


def test_the_leader_lock_is_held_during_the_reset_and_released_after_it(tables):
    owned(tables)
    seen: list[object] = []

    class WatchingStore:
        def __getattr__(self, name):
            return getattr(tables.store, name)

        def reset_checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult:
            seen.append(tables.state.get(LEADER_KEY))
            return tables.store.reset_checkpoint(lease, value)

    tables.reset(TRIM_HORIZON, store=WatchingStore())
    (lock_item,) = seen
    assert lock_item is not None and lock_item["ownerName"] == "leasectl-reset/host/1"
    assert tables.state.get(LEADER_KEY) is None


class CounterMovesBeforeWrites:
    """Renews the stored lease (as a running holder would) just before each of the first `times` reset writes."""

    def __init__(self, store: ConditionalLeaseStore, times: int) -> None:
        self._store = store
        self._times = times
        self.writes = 0

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def reset_checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult:
        self.writes += 1
        if self.writes <= self._times:
            current = self._store.get_lease(lease.lease_key, consistent=True)
            assert current is not None and self._store.renew_lease(current).applied
        return self._store.reset_checkpoint(lease, value)


def test_a_counter_change_between_read_and_write_loses_the_first_attempt_and_the_retry_applies_on_the_fresh_lease(
    tables,
):
    lease = owned(tables)
    interfering = CounterMovesBeforeWrites(tables.store, times=1)
    report = tables.reset(ESN("100"), store=interfering)
    assert (interfering.writes, report.attempts) == (2, 2)
    assert report.plan.before.lease_counter == lease.lease_counter + 1
    stored = tables.stored()
    assert (stored.checkpoint, stored.lease_counter) == (ESN("100"), lease.lease_counter + 1 + 2)


def test_a_lease_that_keeps_changing_is_given_up_after_every_attempt_naming_it_and_left_unchanged(tables):
    owned(tables)
    interfering = CounterMovesBeforeWrites(tables.store, times=99)
    with pytest.raises(CheckpointResetError, match=f"lease '{KEY}' was not reset: its counter changed") as failed:
        tables.reset(ESN("100"), store=interfering)
    assert failed.value.retryable and interfering.writes == 3
    assert tables.stored().checkpoint == ESN("500")
    assert tables.state.get(LEADER_KEY) is None


@pytest.mark.parametrize("write", ["renew", "prepare", "commit"])
def test_a_running_holder_is_fenced_by_the_reset_its_next_write_fails(tables, write):
    holder = HeldLease(tables.store, owned(tables), lease_duration_millis=10_000)
    assert holder.claim()
    holder.prepare(ESN("800"), None)
    tables.reset(ESN("100"))
    if write == "renew":
        assert holder.renew() is False
    else:
        with pytest.raises(LeaseLostError, match="condition failed"):
            holder.prepare(ESN("900"), None) if write == "prepare" else holder.commit(ESN("800"))
    assert holder.is_lost
    stored = tables.stored()
    assert (stored.checkpoint, stored.pending_checkpoint, stored.lease_owner) == (ESN("100"), None, OWNER)


class ResponseLost:
    """Applies each reset write, then answers with the outcome of its retry (a lost condition against itself)."""

    def __init__(self, store: ConditionalLeaseStore) -> None:
        self._store = store

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def reset_checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult:
        assert self._store.reset_checkpoint(lease, value).applied
        return dataclasses.replace(self._store.reset_checkpoint(lease, value), retried=True)


def test_a_reset_whose_response_was_lost_is_recognised_as_applied_and_still_reports_the_batch(tables):
    lease, batch = with_prepared_batch(tables, owned(tables), ESN("800"))
    report = tables.reset(ESN("100"), store=ResponseLost(tables.store))
    assert (report.attempts, report.after.lease_counter) == (1, lease.lease_counter + 2)
    assert report.plan.discarded is not None and report.plan.discarded.batch == batch


def test_a_lease_held_by_another_leader_lock_holder_is_not_reset_and_the_holder_is_named(tables):
    lease = owned(tables)
    round_lock = tables.lock("kinesis_lease_pipeline/manual__2026-01-01")
    assert round_lock.try_acquire()
    with pytest.raises(LeadershipUnavailableError, match="kinesis_lease_pipeline/manual__2026-01-01"):
        tables.reset(ESN("100"))
    assert tables.stored() == lease
    assert round_lock.heartbeat(), "the round's lock must be untouched"


def test_a_lease_at_shard_end_is_refused_and_the_lock_is_released(tables):
    lease = owned(tables)
    finished = tables.store.checkpoint(lease, SHARD_END)
    assert finished.applied
    with pytest.raises(CheckpointResetError, match="SHARD_END"):
        tables.reset(ESN("100"))
    assert tables.stored() == finished.lease
    assert tables.state.get(LEADER_KEY) is None


def test_a_lease_deleted_between_read_and_write_is_reported_as_not_found(tables):
    owned(tables)

    class DeletesFirst:
        def __getattr__(self, name):
            return getattr(tables.store, name)

        def reset_checkpoint(self, lease: Lease, value: ExtendedSequenceNumber) -> WriteResult:
            tables.store.delete_lease(lease.lease_key)
            return tables.store.reset_checkpoint(lease, value)

    with pytest.raises(LeaseNotFoundError, match="deleted during the reset"):
        tables.reset(ESN("100"), store=DeletesFirst())


def test_a_multi_stream_lease_is_reset_by_stream_and_shard_leaving_the_other_streams_alone(tables):
    orders, clicks = StreamIdentifier("123456789012", "orders", 1), StreamIdentifier("123456789012", "clicks", 1)
    owned(tables, lease=Lease.for_stream(orders, KEY, checkpoint=ESN("500")))
    other = owned(tables, lease=Lease.for_stream(clicks, KEY, checkpoint=ESN("500")))
    report = tables.reset(TRIM_HORIZON, LeaseSelector(KEY, "orders"))
    assert report.after.lease_key == orders.lease_key(KEY)
    assert tables.stored(orders.lease_key(KEY)).checkpoint == TRIM_HORIZON
    assert tables.stored(clicks.lease_key(KEY)) == other
