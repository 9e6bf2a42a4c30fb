"""What a steady-state round costs in lease-table requests: nothing that would change nothing.

A round's control plane at steady state (no new shard, nothing to move) must read the lease table
once per step and write nothing to it; an assignment that moves k leases writes k leases. Counted
on the in-memory stores, which take the same requests a DynamoDB store would send (issue 16, item 4).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from devtools.shard_lineage import LineageBuilder
from lease_core.config.settings import ConsumerConfig
from lease_core.leader.assignment_round import ROUND_KEY, AssignmentCoordinator, RoundSnapshot, slot_ids
from lease_core.metrics.worker_metrics import InMemoryWorkerMetricsStore, WorkerMetricStats
from lease_core.model.lease import Lease
from lease_core.model.lease_keys import LeaseKeyScheme
from lease_core.model.shards import Shard
from lease_core.store.codec import Item
from lease_core.store.coordinator_state import InMemoryCoordinatorStateStore
from lease_core.store.lease_store import ItemWrite
from lease_core.store.lease_writes import LeaseDelete, LeaseTransaction, LeaseUpdate
from lease_core.store.memory_store import InMemoryLeaseStore
from lease_core.store.record_table import InMemoryRecordTable, Record
from lease_core.sync.audit import AuditReason, ShardSyncAuditor
from lease_core.sync.step import sync_streams
from tests.support.shard_sources import FakeShardSource

SHARDS = 64
T0 = 1_700_000_000_000


class CountingLeaseStore(InMemoryLeaseStore):
    """Counts the requests a DynamoDB lease store would send: scans, and writes of any kind."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: Counter[str] = Counter()

    def _scan_items(self) -> Iterator[Item]:
        self.requests["scan"] += 1
        return super()._scan_items()

    def _put_item_if_absent(self, item: Item) -> bool:
        self.requests["write"] += 1
        return super()._put_item_if_absent(item)

    def _update_item(self, update: LeaseUpdate) -> ItemWrite:
        self.requests["write"] += 1
        return super()._update_item(update)

    def _delete_item_if(self, delete: LeaseDelete) -> ItemWrite:
        self.requests["write"] += 1
        return super()._delete_item_if(delete)

    def _transact_items(self, transaction: LeaseTransaction) -> tuple[bool, dict[str, Item | None]]:
        self.requests["write"] += 1
        return super()._transact_items(transaction)


class CountingRecordTable(InMemoryRecordTable):
    def __init__(self, table_name: str, hash_key: str) -> None:
        super().__init__(table_name, hash_key)
        self.reads = 0

    def get(self, key: str) -> Record | None:
        self.reads += 1
        return super().get(key)

    def scan(self) -> list[Record]:
        self.reads += 1
        return super().scan()


def synced(
    streams: list[str], config: ConsumerConfig
) -> tuple[CountingLeaseStore, FakeShardSource, InMemoryCoordinatorStateStore]:
    """An application whose leases are already in step with its streams' shards."""
    source = FakeShardSource()
    for name in streams:
        source.create_stream(name, LineageBuilder(SHARDS).shards())
    store, state = CountingLeaseStore(), InMemoryCoordinatorStateStore()
    sync_streams(streams, config, store, source, state, lambda: T0)
    store.requests.clear()
    return store, source, state


@pytest.mark.parametrize(
    "streams", [pytest.param(["orders"], id="single-stream"), pytest.param(["a", "b", "c"], id="multi-stream")]
)
def test_a_steady_state_sync_scans_the_lease_table_once_and_writes_nothing(streams):
    config = ConsumerConfig(application_name="app", multi_stream=len(streams) > 1)
    store, source, state = synced(streams, config)
    report = sync_streams(streams, config, store, source, state, lambda: T0 + 1_000)
    assert report.created == () and report.deleted == ()
    assert store.requests == Counter({"scan": 1})


def test_the_rounds_audit_after_a_sync_judges_the_syncs_snapshot_without_scanning_again():
    config = ConsumerConfig(application_name="app")
    store, source, state = synced(["orders"], config)
    report = sync_streams(["orders"], config, store, source, state, lambda: T0 + 1_000)
    auditor = ShardSyncAuditor(store, state, lambda: T0 + 1_000)
    decision = auditor.audit("orders", LeaseKeyScheme(), lambda: source.list_shards("orders"), 3, report.leases)
    assert decision.reason == AuditReason.NO_HOLE
    assert store.requests == Counter({"scan": 1})


def test_a_sync_that_creates_leases_writes_each_once_and_still_scans_once():
    config = ConsumerConfig(application_name="app")
    store, source, state = synced(["orders"], config)
    for lease in store.list_leases()[:2]:  # two shards without a lease, as a sync interrupted part-way leaves them
        store.delete_lease(lease.lease_key)
    store.requests.clear()
    report = sync_streams(["orders"], config, store, source, state, lambda: T0 + 1_000)
    assert len(report.created) == 2
    assert store.requests == Counter({"scan": 1, "write": 2}), "one write per lease created, one scan"


def metrics_with_every_slot(slots: list[str]) -> tuple[InMemoryWorkerMetricsStore, CountingRecordTable]:
    metrics = InMemoryWorkerMetricsStore()
    table = CountingRecordTable(metrics.table_name, metrics.table.hash_key)
    metrics.table = table
    for slot in slots:
        metrics.put(WorkerMetricStats(slot, 1, {"C": (50.0,)}, {"C": (100.0,)}, round=1))
    table.reads = 0
    return metrics, table


def test_an_assignment_round_that_moves_nothing_writes_no_lease_and_reads_each_table_once():
    slots = slot_ids("app", 8)
    store = CountingLeaseStore()
    for n in range(SHARDS):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}", throughput_kbps=4.0))
    metrics, table = metrics_with_every_slot(slots)
    coordinator = AssignmentCoordinator(
        store, metrics, InMemoryCoordinatorStateStore(), ConsumerConfig(application_name="app"), lambda: T0
    )
    coordinator.run(slots, round_owner="round-1")
    store.requests.clear()
    table.reads = 0
    report = coordinator.run(slots, round_owner="round-2")
    assert report.moves == ()
    assert store.requests == Counter({"scan": 1}), "no lease write, and the lease table scanned once"
    assert table.reads == 1, "the worker metrics read in one request, not one per slot"


def test_an_assignment_that_moves_k_leases_writes_k_and_remembers_the_counters_it_wrote():
    slots = slot_ids("app", 4)
    store = CountingLeaseStore()
    for n in range(SHARDS):
        store.create_lease_if_not_exists(Lease(f"shardId-{n}", throughput_kbps=4.0))
    store.requests.clear()
    state = InMemoryCoordinatorStateStore()
    coordinator = AssignmentCoordinator(
        store, InMemoryWorkerMetricsStore(), state, ConsumerConfig(application_name="app"), lambda: T0
    )
    report = coordinator.run(slots, round_owner="round-1")
    assert len(report.moves) == SHARDS
    assert store.requests == Counter({"scan": 1, "write": SHARDS})
    remembered = state.get(ROUND_KEY)
    assert remembered is not None
    expected = {lease.lease_key: lease.lease_counter for lease in store.list_leases()}
    assert RoundSnapshot.from_item(remembered).lease_counters == expected


def item_bytes(record: Record) -> int:
    """An upper bound of DynamoDB's item size: names plus values as their JSON text (binary: its length)."""
    return sum(
        len(name) + (len(value) if isinstance(value, bytes) else len(str(value))) for name, value in record.items()
    )


def many_leases(streams: int, shards: int) -> list[Lease]:
    return [
        Lease(
            f"123456789012:stream-{s}:1764000000:shardId-{n:012d}", lease_owner=f"app-worker-{n % 100}", lease_counter=n
        )
        for s in range(streams)
        for n in range(shards)
    ]


def test_the_remembered_round_of_10000_multi_stream_leases_fits_a_dynamodb_item_and_reads_back():
    leases = many_leases(10, 1_000)
    item = RoundSnapshot().next(7, "owner", T0, leases).to_item()
    assert item_bytes(item) < 100_000, "DynamoDB refuses items over 400 KB, and a write costs 1 WRU per KB"
    assert RoundSnapshot.from_item(item).lease_counters == {lease.lease_key: lease.lease_counter for lease in leases}


def test_a_round_remembered_in_the_former_format_still_reads():
    item = {"round": 3, "assignedAt": T0, "leaseCounters": {"shardId-1": 4}, "handoffs": {}}
    assert RoundSnapshot.from_item(item).lease_counters == {"shardId-1": 4}


def test_the_metrics_of_the_rounds_slots_are_read_in_one_scan_and_another_workers_bad_item_is_not_decoded():
    slots = slot_ids("app", 2)
    metrics, table = metrics_with_every_slot(slots)
    table.put("gone-host", {"lut": "not a number", "sts": "garbage"})
    table.reads = 0
    assert sorted(metrics.read_for_round(slots, 0)[0]) == slots
    assert table.reads == 1


class ScanAfterListing(CountingLeaseStore):
    """A lease store whose scan notes whether every stream's listing had been asked for by then."""

    def __init__(self, listed: dict[str, threading.Event]) -> None:
        super().__init__()
        self.listed = listed
        self.listings_asked_before_scan: bool | None = None

    def _scan_items(self) -> Iterator[Item]:
        self.listings_asked_before_scan = all(event.wait(timeout=5) for event in self.listed.values())
        return super()._scan_items()


class NotingShardSource(FakeShardSource):
    def __init__(self, listed: dict[str, threading.Event]) -> None:
        super().__init__()
        self.listed = listed

    def list_shards(self, stream_name: str) -> list[Shard]:
        self.listed[stream_name].set()
        return super().list_shards(stream_name)


@pytest.mark.parametrize(
    "streams", [pytest.param(["orders"], id="single-stream"), pytest.param(["a", "b", "c"], id="multi-stream")]
)
def test_a_sync_asks_for_every_streams_listing_while_it_scans(streams):
    # The scan (DynamoDB) and the listings (Kinesis) wait on different services: a step takes the
    # longer of the two, not both. A scan that waits until every listing was asked for shows it.
    config = ConsumerConfig(application_name="app", multi_stream=len(streams) > 1)
    listed = {name: threading.Event() for name in streams}
    store, source, state = ScanAfterListing(listed), NotingShardSource(listed), InMemoryCoordinatorStateStore()
    for name in streams:
        source.create_stream(name, LineageBuilder(SHARDS).shards())
    sync_streams(streams, config, store, source, state, lambda: T0)
    store.requests.clear()
    for event in listed.values():
        event.clear()
    report = sync_streams(streams, config, store, source, state, lambda: T0 + 1_000)
    assert store.listings_asked_before_scan is True
    assert report.created == () and report.deleted == () and store.requests == Counter({"scan": 1})
