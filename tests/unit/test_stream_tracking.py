"""Former streams in multi-stream mode: deferred deletion decided across rounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lease_core.model.lease import Lease, StreamIdentifier
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore, update_record
from lease_core.store.memory_store import InMemoryLeaseStore
from lease_core.sync.stream_tracking import (
    DEFERRED_DELETION,
    FORMER_STREAMS_KEY,
    NO_DELETION,
    FormerStreamsCleaner,
    decide_former_streams,
)
from tests.support.stores import InterleavingStateStore

A = "111122223333:orders:100"
B = "111122223333:payments:200"
HOUR = 3_600_000


@pytest.mark.parametrize(
    ("configured", "pending", "gone", "now", "strategy", "expected_pending", "expected_delete"),
    [
        pytest.param({A, B}, {}, set(), 0, DEFERRED_DELETION, {}, (), id="all-configured"),
        pytest.param({A}, {}, set(), 5, DEFERRED_DELETION, {B: 5}, (), id="first-seen-unconfigured"),
        pytest.param({A}, {B: 5}, set(), 5 + HOUR - 1, DEFERRED_DELETION, {B: 5}, (), id="still-waiting"),
        pytest.param({A}, {B: 5}, set(), 5 + HOUR, DEFERRED_DELETION, {}, (B,), id="wait-elapsed"),
        pytest.param({A}, {}, {B}, 5, DEFERRED_DELETION, {}, (B,), id="deleted-in-kinesis-goes-at-once"),
        pytest.param({A, B}, {B: 5}, set(), 5 + HOUR, DEFERRED_DELETION, {}, (), id="reconfigured-forgets-pending"),
        pytest.param({A}, {B: 5}, {B}, 5 + HOUR, NO_DELETION, {}, (), id="no-deletion-strategy"),
    ],
)
def test_former_stream_decisions(configured, pending, gone, now, strategy, expected_pending, expected_delete):
    decision = decide_former_streams(configured, {A, B}, pending, gone, now, strategy, HOUR)
    assert dict(decision.pending) == expected_pending
    assert decision.delete_leases_of == expected_delete


def test_a_former_streams_leases_are_deleted_after_the_wait_counted_across_runs():
    store = InMemoryLeaseStore()
    orders, payments = StreamIdentifier.parse(A), StreamIdentifier.parse(B)
    for stream in (orders, payments):
        for shard in ("shardId-0", "shardId-1"):
            store.create_lease_if_not_exists(Lease.for_stream(stream, shard))
    now = [1_000]
    state = InMemoryCoordinatorStateStore()

    def cleaner() -> FormerStreamsCleaner:  # a new one per round: memory lives in the state store only
        return FormerStreamsCleaner(store, state, lambda stream: True, lambda: now[0], DEFERRED_DELETION, HOUR)

    first = cleaner().run([orders])
    assert dict(first.pending) == {B: 1_000} and first.deleted_leases == {}
    now[0] += HOUR
    second = cleaner().run([orders])
    assert second.deleted_leases == {B: (f"{B}:shardId-0", f"{B}:shardId-1")}
    assert sorted(lease.stream_name for lease in store.list_leases()) == [A, A]


def former_stream_table() -> InMemoryLeaseStore:
    store = InMemoryLeaseStore()
    for stream in (StreamIdentifier.parse(A), StreamIdentifier.parse(B)):
        for shard in ("shardId-0", "shardId-1"):
            store.create_lease_if_not_exists(Lease.for_stream(stream, shard))
    return store


def test_a_pending_time_written_by_another_round_meanwhile_is_kept_not_overwritten():
    def other_round(state) -> None:  # saw B unconfigured first, at 400
        update_record(state, FORMER_STREAMS_KEY, lambda record: {"pending": {B: 400}})

    state = InterleavingStateStore(FORMER_STREAMS_KEY, other_round)
    cleaner = FormerStreamsCleaner(
        former_stream_table(), state, lambda stream: True, lambda: 1_000, DEFERRED_DELETION, HOUR
    )

    outcome = cleaner.run([StreamIdentifier.parse(A)])

    assert dict(outcome.pending) == {B: 400}
    assert state.get(FORMER_STREAMS_KEY)["pending"] == {B: 400}


class WorkedOnAfterListing(InMemoryLeaseStore):
    """Lists the leases, then someone renews `lease_key`: the listing is a snapshot that has aged."""

    def __init__(self, lease_key: str) -> None:
        super().__init__()
        self.lease_key = lease_key

    def list_leases(self) -> list[Lease]:
        snapshot = super().list_leases()
        self.renew_lease(self.get_lease(self.lease_key))
        return snapshot


def test_a_former_streams_lease_changed_since_it_was_listed_is_kept_and_reported():
    store = WorkedOnAfterListing(f"{B}:shardId-1")
    for lease in former_stream_table().list_leases():
        store.create_lease_if_not_exists(lease)
    cleaner = FormerStreamsCleaner(
        store,
        InMemoryCoordinatorStateStore(),
        lambda stream: stream.serialize() != B,
        lambda: 1_000,
        DEFERRED_DELETION,
        HOUR,
    )

    outcome = cleaner.run([StreamIdentifier.parse(A)])

    assert outcome.deleted_leases == {B: (f"{B}:shardId-0",)}
    assert outcome.changed_leases == {B: (f"{B}:shardId-1",)}
    assert store.get_lease(f"{B}:shardId-1") is not None


@pytest.mark.parametrize(
    ("awaiting", "kept"),
    [
        pytest.param(None, True, id="no-sink-to-ask"),
        pytest.param(lambda lease: True, True, id="not-visible-yet"),
        pytest.param(lambda lease: False, False, id="visible"),
    ],
)
def test_a_former_streams_lease_stays_while_its_committed_batches_may_not_be_visible(awaiting, kept):
    store = InMemoryLeaseStore()
    stream = StreamIdentifier.parse(B)
    store.create_lease_if_not_exists(
        replace(Lease.for_stream(stream, "shardId-0"), committed_batch='{"f":"iceberg/1"}')
    )
    store.create_lease_if_not_exists(Lease.for_stream(stream, "shardId-1"))
    cleaner = FormerStreamsCleaner(
        store, InMemoryCoordinatorStateStore(), lambda stream: False, lambda: 1_000, DEFERRED_DELETION, HOUR, awaiting
    )

    outcome = cleaner.run([StreamIdentifier.parse(A)])  # B is gone from Kinesis: its leases go at once

    waiting = f"{B}:shardId-0"
    assert outcome.deleted_leases == {B: (f"{B}:shardId-1",) if kept else (waiting, f"{B}:shardId-1")}
    assert (store.get_lease(waiting) is not None) == kept
