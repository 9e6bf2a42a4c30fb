"""A KCL 3.5 single-table application handed over to this project and back (moto).

The lease table is written item by item as KCL 3.5 writes it (tests.support.kcl_tables): a lease, a
KCL worker's metrics, KCL's leader lock and its completed table migration, all in the lease table.
This project follows that layout (docs/protocol.md §1.7): it creates no table of its own beside it,
its leader lock is KCL's `Leader` item so the two exclude each other, and what it writes there is
tagged as KCL 3.5 reads it, so KCL finds its table as it left it plus items it knows how to read.
"""

from __future__ import annotations

import json
from decimal import Decimal

import boto3
import pytest

from lease_core.application import LeaseApplication
from lease_core.metrics.worker_metrics import publish_worker_metrics
from lease_core.store.coordinator_state import update_record
from lease_core.store.table_layout import SINGLE
from tests.support.kcl_tables import LEADER_LOCK, LEASE, TABLE_MIGRATION, WORKER_METRIC_STATS, kcl_lease_table
from tests.support.leasectl import run_leasectl
from tests.support.stores import fast_config, table_names

# KCL 3.5's entity types (EntityType.java): an item tagged otherwise would be read by KCL as a lease.
KCL_ENTITY_TYPES = {"LEASE", "STREAM", "LEADER", "CLIENT_VERSION_MIGRATION", "TABLE_MIGRATION", "WORKER_METRIC_STATS"}


@pytest.fixture
def client(moto_endpoint):
    return boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def kcl_application(moto_endpoint, client, unique_name) -> LeaseApplication:
    """A KCL 3.5 application's lease table, taken over by an application configured `separate`: the
    tables say `single`, and the tables win."""
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS, LEADER_LOCK, TABLE_MIGRATION)
    config = fast_config(unique_name, lease_table_layout="separate", aws_endpoint_url_dynamodb=moto_endpoint)
    return LeaseApplication(config)


def raw_items(client, table_name: str) -> dict[str, dict]:
    items = client.scan(TableName=table_name, ConsistentRead=True)["Items"]
    return {item["leaseKey"]["S"]: item for item in items}


def test_a_kcl_3_5_application_is_followed_in_its_single_table_layout(kcl_application, client, unique_name):
    kcl_application.tables.ensure_tables()
    assert kcl_application.table_layout.layout == SINGLE
    tables = table_names(client)
    assert f"{unique_name}-CoordinatorState" not in tables
    assert f"{unique_name}-WorkerMetricStats" not in tables


def test_a_kcl_worker_s_metrics_in_the_lease_table_are_read(kcl_application):
    stats = kcl_application.worker_metrics.get("worker-1")
    assert stats is not None
    assert stats.stats == {"C": (12.5, -1.0)}
    assert stats.is_failing()
    assert [worker.worker_id for worker in kcl_application.worker_metrics.list_all()] == ["worker-1"]


def test_the_leader_lock_is_kcl_s_so_a_round_waits_while_a_kcl_worker_leads(kcl_application, client, unique_name):
    assert not kcl_application.leader_lock("round-1").try_acquire()
    client.delete_item(TableName=unique_name, Key={"leaseKey": {"S": "Leader"}})  # KCL releases with a delete
    lock = kcl_application.leader_lock("round-1")
    assert lock.try_acquire()
    leader = raw_items(client, unique_name)["Leader"]
    assert leader["ownerName"] == {"S": "round-1"}
    assert leader["entityType"] == {"S": "LEADER"}
    assert lock.release()
    assert "Leader" not in raw_items(client, unique_name)


def test_what_a_round_writes_is_tagged_as_kcl_3_5_reads_it_and_kcl_s_items_are_untouched(
    kcl_application, client, unique_name
):
    publish_worker_metrics(kcl_application.worker_metrics, "app-worker-0", 42.0, now=1_700_000_100, round=1)
    update_record(kcl_application.state_store, "AssignmentRound", lambda record: {"round": 1})
    items = raw_items(client, unique_name)
    metrics = items["app-worker-0"]
    assert metrics["entityType"] == {"S": "WORKER_METRIC_STATS"}
    assert metrics["sts"] == {"M": {"C": {"L": [{"N": "42"}]}}}
    assert "wid" not in metrics
    assert items["AssignmentRound"]["entityType"] == {"S": "LEADER"}
    assert {item["entityType"]["S"] for item in items.values()} <= KCL_ENTITY_TYPES
    for kcl_item in (LEASE, WORKER_METRIC_STATS, TABLE_MIGRATION):
        assert items[kcl_item["leaseKey"]["S"]] == kcl_item


def test_the_lease_store_still_sees_only_the_lease(kcl_application):
    publish_worker_metrics(kcl_application.worker_metrics, "app-worker-0", 42.0, now=1_700_000_100, round=1)
    update_record(kcl_application.state_store, "AssignmentRound", lambda record: {"round": Decimal(1)})
    assert [lease.lease_key for lease in kcl_application.lease_store.list_leases()] == ["shardId-000000000008"]
    assert kcl_application.state_store.get("shardId-000000000008") is None
    assert kcl_application.worker_metrics.get("shardId-000000000008") is None


def test_leasectl_status_shows_the_single_layout_and_kcl_s_migration_state(moto_endpoint, client, unique_name):
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS, LEADER_LOCK, TABLE_MIGRATION)
    result = run_leasectl("--app", unique_name, "status", dynamodb=moto_endpoint)
    assert result.returncode == 0, result.stderr
    assert "Table layout: single (KCL 3.5's table migration is complete in" in result.stdout
    assert "table migration: TABLE_MIGRATION_STATUS_COMPLETE" in result.stdout
    document = json.loads(run_leasectl("--app", unique_name, "status", "--json", dynamodb=moto_endpoint).stdout)
    assert document["table_layout"]["layout"] == "single"
    assert document["table_layout"]["table_migration"] == "TABLE_MIGRATION_STATUS_COMPLETE"
    assert document["lease_count"] == 1
