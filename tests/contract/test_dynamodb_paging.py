"""DynamoDB reads that span pages and scan segments return every item exactly once."""

from __future__ import annotations

from lease_core.model.lease import Lease
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from tests.support.faults import FaultInjectingClient
from tests.support.stores import FAST_RETRIES, dynamodb_store


def counting_store(endpoint: str, name: str, **options) -> tuple[DynamoDBLeaseStore, FaultInjectingClient]:
    seeded = dynamodb_store(endpoint, name)
    for n in range(11):
        seeded.create_lease_if_not_exists(Lease(f"shardId-{n:012d}"))
        seeded.assign_lease(seeded.get_lease(f"shardId-{n:012d}"), "worker-a" if n % 3 else "worker-b")
    client = FaultInjectingClient(seeded.client, lambda method, number: None)
    return DynamoDBLeaseStore(client, name, retry_policy=FAST_RETRIES, **options), client


def test_a_paginated_scan_returns_every_lease_once(moto_endpoint, unique_name):
    store, client = counting_store(moto_endpoint, unique_name, page_size=2)
    keys = [lease.lease_key for lease in store.list_leases()]
    assert sorted(keys) == [f"shardId-{n:012d}" for n in range(11)]
    assert client.calls["scan"] >= 6, "eleven leases at two per page need at least six pages"


def test_a_parallel_scan_over_configured_segments_returns_every_lease_once(moto_endpoint, unique_name):
    store, client = counting_store(moto_endpoint, unique_name, scan_total_segments=4, page_size=3)
    keys = [lease.lease_key for lease in store.list_leases()]
    assert sorted(keys) == [f"shardId-{n:012d}" for n in range(11)]
    assert store.scan_segment_count() == 4 and client.calls["scan"] >= 4


def test_a_small_table_is_scanned_in_one_segment(moto_endpoint, unique_name):
    store, client = counting_store(moto_endpoint, unique_name)
    assert len(store.list_leases()) == 11
    assert store.scan_segment_count() == 1 and client.calls["scan"] == 1


def test_the_owner_index_query_follows_every_page(moto_endpoint, unique_name):
    store, client = counting_store(moto_endpoint, unique_name, page_size=2)
    assert store.list_lease_keys_for_owner("worker-a") == [f"shardId-{n:012d}" for n in range(11) if n % 3]
    assert client.calls["query"] >= 4
