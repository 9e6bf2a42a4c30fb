"""Lease stores under test: the in-memory one and the DynamoDB one on a moto server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3

from lease_core.application import LeaseApplication
from lease_core.config.settings import ConsumerConfig
from lease_core.metrics.worker_metrics import WorkerMetricsStore
from lease_core.retry import RetryPolicy
from lease_core.store.codec import Item
from lease_core.store.coordinator_state import CoordinatorStateStore, InMemoryCoordinatorStateStore
from lease_core.store.dynamodb_store import DynamoDBLeaseStore
from lease_core.store.lease_store import ConditionalLeaseStore
from lease_core.store.memory_store import InMemoryLeaseStore
from lease_core.store.table_layout import TableLayoutName
from lease_core.store.tables import TableAdministrator

FAST_RETRIES = RetryPolicy(attempts=4, base_millis=1, max_millis=5)


def fast_config(application_name: str, **overrides: Any) -> ConsumerConfig:
    """A configuration that polls table status quickly, as an emulator needs no patience."""
    return ConsumerConfig(application_name=application_name, table_status_poll_seconds=0.05, **overrides)


def dynamodb_store(
    endpoint: str, application_name: str, layout: TableLayoutName | None = None, **store_options: Any
) -> DynamoDBLeaseStore:
    """The lease store of an application whose tables are set up in `layout` (the default layout when None)."""
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    config = fast_config(application_name, **({} if layout is None else {"lease_table_layout": layout}))
    TableAdministrator(client, config, retry_policy=FAST_RETRIES).ensure_tables()
    return DynamoDBLeaseStore(client, config.lease_table, retry_policy=FAST_RETRIES, **store_options)


def dynamodb_state_store(endpoint: str, application_name: str) -> CoordinatorStateStore:
    """The coordinator-state records of an application whose tables are set up, in whichever layout they
    have, as the application's own processes read and write them."""
    return _application(endpoint, application_name).state_store_with(FAST_RETRIES)


def dynamodb_worker_metrics(endpoint: str, application_name: str) -> WorkerMetricsStore:
    """The worker metrics of an application whose tables are set up, in whichever layout they have."""
    return _application(endpoint, application_name).worker_metrics


def _application(endpoint: str, application_name: str) -> LeaseApplication:
    return LeaseApplication(fast_config(application_name, aws_endpoint_url_dynamodb=endpoint, aws_region="us-east-1"))


def put_raw_item(store: ConditionalLeaseStore, item: Item) -> None:
    """Write an item as other tooling might, bypassing every check of ours."""
    if isinstance(store, InMemoryLeaseStore):
        store.put_raw_item(item)
    else:
        assert isinstance(store, DynamoDBLeaseStore)
        store.client.put_item(TableName=store.table_name, Item=item)


def raw_item(store: ConditionalLeaseStore, lease_key: str) -> Item | None:
    """The stored item exactly as the table holds it."""
    if isinstance(store, InMemoryLeaseStore):
        return store.raw_item(lease_key)
    assert isinstance(store, DynamoDBLeaseStore)
    response = store.client.get_item(
        TableName=store.table_name, Key={"leaseKey": {"S": lease_key}}, ConsistentRead=True
    )
    return response.get("Item")


class InterleavingStateStore(InMemoryCoordinatorStateStore):
    """Runs `interloper(self)` once, right after the first read of `key`: another writer's update
    lands between that reader's read and its write."""

    def __init__(self, key: str, interloper: Callable[[InMemoryCoordinatorStateStore], object]) -> None:
        super().__init__()
        self._key = key
        self._interloper: Callable[[InMemoryCoordinatorStateStore], object] | None = interloper

    def get(self, key: str) -> Item | None:
        record = super().get(key)
        if key == self._key and self._interloper is not None:
            interloper, self._interloper = self._interloper, None
            interloper(self)
        return record


def table_names(client: Any) -> set[str]:
    """Every table's name, from every page of ListTables: the suite's tables run to many pages, and a
    test that a table is absent or there must not read only the first."""
    return {name for page in client.get_paginator("list_tables").paginate() for name in page["TableNames"]}
