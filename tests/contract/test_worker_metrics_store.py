"""One contract for the worker-metrics store: in memory and on DynamoDB (moto), in its own table
(`<app>-WorkerMetricStats`) and in the lease table (KCL 3.5's single-table layout, docs/protocol.md §1.7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lease_core.errors import TableNotFoundError
from lease_core.metrics.worker_metrics import (
    DynamoDBWorkerMetricsStore,
    InMemoryWorkerMetricsStore,
    WorkerMetricsStore,
    WorkerMetricStats,
)
from lease_core.store.lease_table_records import worker_metrics_records
from lease_core.store.record_table import DynamoDBRecordTable, InMemoryRecordTable
from tests.support.faults import FaultInjectingClient, client_error
from tests.support.stores import FAST_RETRIES, dynamodb_store


@pytest.fixture(params=["memory", "dynamodb", "memory lease table", "dynamodb lease table"])
def store(request, unique_name):
    if request.param == "memory":
        return InMemoryWorkerMetricsStore()
    if request.param == "memory lease table":
        return WorkerMetricsStore(worker_metrics_records(InMemoryRecordTable("in-memory-leases", "leaseKey")))
    lease_store = dynamodb_store(request.getfixturevalue("moto_endpoint"), unique_name, layout="separate")
    if request.param == "dynamodb lease table":
        lease_table = DynamoDBRecordTable(lease_store.client, unique_name, "leaseKey", FAST_RETRIES)
        return WorkerMetricsStore(worker_metrics_records(lease_table))
    return DynamoDBWorkerMetricsStore(lease_store.client, f"{unique_name}-WorkerMetricStats", retry_policy=FAST_RETRIES)


def raw_put(store, record) -> None:
    """Write a record as other tooling might, bypassing the typed stats."""
    store.table.put(record["wid"], record)


def cpu(worker_id: str, values=(10.0, 20.5), lut: int = 1_700_000_000, round_: int | None = 4) -> WorkerMetricStats:
    return WorkerMetricStats(worker_id, lut, {"C": tuple(values)}, {"C": (100.0,)}, round=round_)


def test_a_missing_worker_reads_as_none(store):
    assert store.get("app-worker-0") is None


def test_put_then_get_returns_the_same_stats(store):
    stats = cpu("app-worker-0", values=(12.345678, -1.0, 99.999999))
    store.put(stats)
    assert store.get("app-worker-0") == stats


def test_a_default_metric_worker_round_trips(store):
    store.put(WorkerMetricStats("app-worker-1", 5, round=2))
    assert store.get("app-worker-1") == WorkerMetricStats("app-worker-1", 5, round=2)


def test_put_replaces_the_metric_history(store):
    store.put(cpu("app-worker-0", values=(1.0, 2.0)))
    store.put(cpu("app-worker-0", values=(3.0,), lut=1_700_000_100, round_=5))
    assert store.get("app-worker-0") == cpu("app-worker-0", values=(3.0,), lut=1_700_000_100, round_=5)


def test_put_keeps_attributes_written_by_others(store):
    raw_put(store, cpu("app-worker-0").to_item() | {"sup": 1, "properties": {"zone": "a"}})
    store.put(cpu("app-worker-0", values=(7.0,), round_=None))
    expected = replace(cpu("app-worker-0", values=(7.0,), round_=4), support_code=1)
    assert store.get("app-worker-0") == expected, "absent round and support code are not erased"
    assert store.table.get("app-worker-0")["properties"] == {"zone": "a"}


def test_list_all_returns_every_worker(store):
    for n in range(5):
        store.put(cpu(f"app-worker-{n}", values=(float(n),)))
    listed = sorted(store.list_all(), key=lambda stats: stats.worker_id)
    assert listed == [cpu(f"app-worker-{n}", values=(float(n),)) for n in range(5)]


def test_a_corrupt_item_fails_loudly_naming_the_worker(store):
    raw_put(store, {"wid": "app-worker-0", "lut": "yesterday"})
    with pytest.raises(ValueError, match=r"'app-worker-0'.*'lut'"):
        store.get("app-worker-0")


@pytest.mark.parametrize(
    ("lut", "deleted"),
    [pytest.param(1_700_000_000, True, id="unchanged"), pytest.param(1_699_999_999, False, id="rewritten-since-read")],
)
def test_delete_only_if_the_last_update_is_unchanged(store, lut, deleted):
    store.put(cpu("app-worker-0"))
    assert store.delete_if_unchanged("app-worker-0", lut) is deleted
    assert (store.get("app-worker-0") is None) is deleted


def test_deleting_a_missing_worker_reports_false(store):
    assert store.delete_if_unchanged("app-worker-0", 1) is False


def test_the_dynamodb_scan_follows_every_page(moto_endpoint, unique_name):
    lease_store = dynamodb_store(moto_endpoint, unique_name, layout="separate")
    client = FaultInjectingClient(lease_store.client, lambda method, number: None)
    store = DynamoDBWorkerMetricsStore(
        client, f"{unique_name}-WorkerMetricStats", retry_policy=FAST_RETRIES, page_size=2
    )
    for n in range(7):
        store.put(cpu(f"app-worker-{n}"))
    assert sorted(stats.worker_id for stats in store.list_all()) == [f"app-worker-{n}" for n in range(7)]
    assert client.calls["scan"] >= 4, "seven workers at two per page need at least four pages"


def test_a_throttled_write_is_retried_and_lands_once(moto_endpoint, unique_name):
    lease_store = dynamodb_store(moto_endpoint, unique_name, layout="separate")
    throttle_first = lambda method, number: client_error("ThrottlingException", "UpdateItem") if number == 1 else None  # noqa: E731
    store = DynamoDBWorkerMetricsStore(
        FaultInjectingClient(lease_store.client, throttle_first),
        f"{unique_name}-WorkerMetricStats",
        retry_policy=FAST_RETRIES,
    )
    store.put(cpu("app-worker-0"))
    assert store.get("app-worker-0") == cpu("app-worker-0")


def test_a_missing_table_is_reported_by_name(moto_endpoint, unique_name):
    lease_store = dynamodb_store(moto_endpoint, unique_name, layout="separate")
    store = DynamoDBWorkerMetricsStore(lease_store.client, f"{unique_name}-Missing", retry_policy=FAST_RETRIES)
    with pytest.raises(TableNotFoundError):
        store.list_all()


def test_a_rounds_read_gives_its_slots_stats_and_the_other_workers_last_updated_before_the_bound(store):
    store.put(cpu("app-worker-0", lut=100))  # a slot of the round, however old
    store.put(cpu("app-worker-5", lut=199))  # a slot of an earlier, wider round, stale
    store.put(cpu("app-worker-6", lut=200))  # written at the bound: not before it
    store.put(WorkerMetricStats("kcl-host-a", 150))  # a KCL worker sharing the table, stale
    raw_put(store, {"wid": "by-hand", "lut": "yesterday"})  # unreadable: not judged, and fails nothing
    stored, stale = store.read_for_round(["app-worker-0", "app-worker-1"], stale_before_epoch_seconds=200)
    assert stored == {"app-worker-0": cpu("app-worker-0", lut=100)}
    assert stale == {"app-worker-5": 199, "kcl-host-a": 150}


def test_an_item_an_earlier_release_wrote_in_milliseconds_is_judged_stale_in_seconds(store):
    store.put(cpu("app-worker-7", lut=1_700_000_000_123))  # a slot of a release that wrote `lut` in milliseconds
    store.put(cpu("app-worker-8", lut=1_800_000_000_000))  # the same, after the bound
    _, stale = store.read_for_round(["app-worker-0"], stale_before_epoch_seconds=1_750_000_000)
    assert stale == {"app-worker-7": 1_700_000_000_123}, "deleted on the value stored"
