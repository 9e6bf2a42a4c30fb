"""In KCL 3.5's single-table layout the lease table holds leases beside worker metrics and coordinator
state (docs/protocol.md §1.6, §1.7): a write of one kind never changes an item of another kind under
the same `leaseKey`, in memory and on DynamoDB (moto)."""

from __future__ import annotations

import boto3
import pytest

from lease_core.model.lease import Lease
from lease_core.store.lease_store import ConditionalLeaseStore
from lease_core.store.lease_table_records import coordinator_state_records, worker_metrics_records
from lease_core.store.lease_writes import MetaField
from lease_core.store.memory_store import InMemoryLeaseStore
from lease_core.store.record_table import DynamoDBRecordTable, InMemoryRecordTable, RecordTable
from tests.support.kcl_tables import LEADER_LOCK, WORKER_METRIC_STATS
from tests.support.stores import FAST_RETRIES, dynamodb_store, put_raw_item, raw_item

WORKER = WORKER_METRIC_STATS["leaseKey"]["S"]


@pytest.fixture(params=["memory", "dynamodb"])
def store(request: pytest.FixtureRequest, unique_name: str) -> ConditionalLeaseStore:
    if request.param == "memory":
        return InMemoryLeaseStore()
    return dynamodb_store(request.getfixturevalue("moto_endpoint"), unique_name)


@pytest.fixture(params=["memory", "dynamodb"])
def lease_table(request: pytest.FixtureRequest, unique_name: str) -> RecordTable:
    """The lease table as the worker-metrics and coordinator-state records see it, holding one lease."""
    if request.param == "memory":
        table = InMemoryRecordTable("in-memory-leases", "leaseKey")
        table.put("shardId-0", {"leaseCounter": 0, "checkpoint": "TRIM_HORIZON"})
        return table
    endpoint = request.getfixturevalue("moto_endpoint")
    dynamodb_store(endpoint, unique_name).create_lease_if_not_exists(Lease("shardId-0"))
    client = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    return DynamoDBRecordTable(client, unique_name, "leaseKey", FAST_RETRIES)


LEASE_WRITES = [
    pytest.param(lambda store, key: store.assign_lease(Lease(key), "slot-1").applied, id="assign"),
    pytest.param(lambda store, key: store.update_lease(Lease(key)).applied, id="update"),
    pytest.param(
        lambda store, key: store.update_lease_meta(Lease(key, child_shard_ids={"shardId-9"}), MetaField.CHILD_SHARDS),
        id="child-shard-ids",
    ),
    pytest.param(lambda store, key: store.delete_lease_if_unchanged(Lease(key)).applied, id="delete-if-unchanged"),
    pytest.param(lambda store, key: store.delete_lease(key), id="delete"),
]


@pytest.mark.parametrize("item", [WORKER_METRIC_STATS, LEADER_LOCK], ids=["worker-metrics", "leader-lock"])
@pytest.mark.parametrize("write", LEASE_WRITES)
def test_a_lease_write_under_the_key_of_another_entity_changes_nothing(store, item, write):
    put_raw_item(store, item)
    key = item["leaseKey"]["S"]
    assert not write(store, key)
    assert raw_item(store, key) == item


RECORD_WRITES = [
    pytest.param(lambda records: records.put("shardId-0", {"ownerName": "x"}), id="put"),
    pytest.param(
        lambda records: records.put("shardId-0", {"ownerName": "x"}, expected={"ownerName": None}), id="put-if"
    ),
    pytest.param(lambda records: records.delete("shardId-0"), id="delete"),
]


@pytest.mark.parametrize("view", [coordinator_state_records, worker_metrics_records], ids=["state", "metrics"])
@pytest.mark.parametrize("write", RECORD_WRITES)
def test_a_record_write_under_a_leases_key_changes_nothing(lease_table, view, write):
    before = lease_table.get("shardId-0")
    assert not write(view(lease_table))
    assert lease_table.get("shardId-0") == before


@pytest.mark.parametrize("view", [coordinator_state_records, worker_metrics_records], ids=["state", "metrics"])
def test_a_record_update_under_a_leases_key_is_refused_naming_the_key(lease_table, view):
    before = lease_table.get("shardId-0")
    with pytest.raises(ValueError, match="holds a lease under 'shardId-0'"):
        view(lease_table).update("shardId-0", {"lut": 5})
    assert lease_table.get("shardId-0") == before


def test_records_are_still_written_beside_leases(lease_table):
    metrics = worker_metrics_records(lease_table)
    assert metrics.update(WORKER, {"lut": 5})
    assert metrics.get(WORKER) == {"wid": WORKER, "lut": 5}
    assert metrics.delete(WORKER)
