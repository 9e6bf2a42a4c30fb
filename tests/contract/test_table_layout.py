"""The table layout of an application is read from its tables, as KCL 3.0-3.4 and KCL 3.5 write them (moto).

Each application's tables are written item by item as KCL writes them (docs/protocol.md §1.7):
KCL 3.5's single-table lease table holds leases, worker metrics, the leader lock and the
table-migration state, each tagged by `entityType`; KCL 3.0-3.4 keep the last three in
`<app>-WorkerMetricStats` and `<app>-CoordinatorState`.
"""

from __future__ import annotations

import boto3
import pytest

from lease_core.errors import LayoutConflictError
from lease_core.model.sequence import LATEST
from lease_core.store.table_layout import SEPARATE, SINGLE, TableLayoutName, detect_layout
from tests.support.faults import FaultInjectingClient
from tests.support.kcl_tables import (
    LEADER_LOCK,
    LEASE,
    TABLE_MIGRATION,
    WORKER_METRIC_STATS,
    kcl_lease_table,
    kcl_separate_table,
)
from tests.support.stores import FAST_RETRIES, dynamodb_store, fast_config, put_raw_item


@pytest.fixture
def client(moto_endpoint):
    return boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")


def detect(client, name: str, configured: TableLayoutName = SINGLE):
    config = fast_config(name)
    separate_tables = (config.worker_metrics_table, config.coordinator_state_table)
    return detect_layout(client, config.lease_table, separate_tables, configured, FAST_RETRIES)


def test_a_kcl_3_5_single_table_application_is_detected_as_single(client, unique_name):
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS, LEADER_LOCK, TABLE_MIGRATION)
    assert detect(client, unique_name).layout == SINGLE


def test_a_kcl_3_0_application_with_its_three_tables_is_detected_as_separate(client, unique_name):
    kcl_lease_table(client, unique_name, LEASE)
    worker_metrics = {key: value for key, value in WORKER_METRIC_STATS.items() if key not in ("leaseKey", "entityType")}
    kcl_separate_table(client, f"{unique_name}-WorkerMetricStats", "wid", {"wid": {"S": "worker-1"}, **worker_metrics})
    leader = {key: value for key, value in LEADER_LOCK.items() if key not in ("leaseKey", "entityType")}
    kcl_separate_table(client, f"{unique_name}-CoordinatorState", "key", {"key": {"S": "Leader"}, **leader})
    decision = detect(client, unique_name)
    assert decision.layout == SEPARATE
    assert f"{unique_name}-WorkerMetricStats" in decision.reason


def test_the_tables_this_project_creates_are_detected_as_separate(moto_endpoint, client, unique_name):
    dynamodb_store(moto_endpoint, unique_name, layout="separate")
    assert detect(client, unique_name).layout == SEPARATE


def test_a_new_application_gets_kcl_3_5_single_table_layout(client, unique_name):
    decision = detect(client, unique_name)
    assert decision.layout == SINGLE
    assert "new application" in decision.reason


def test_a_new_application_configured_separate_gets_the_separate_layout(client, unique_name):
    assert detect(client, unique_name, configured=SEPARATE).layout == SEPARATE


def test_a_lease_table_holding_only_leases_gets_the_configured_layout(client, unique_name):
    kcl_lease_table(client, unique_name, LEASE)
    assert detect(client, unique_name).layout == SINGLE
    assert detect(client, unique_name, configured=SEPARATE).layout == SEPARATE


def test_an_existing_layout_is_followed_whatever_the_setting_says(client, unique_name):
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS)
    assert detect(client, unique_name, configured=SEPARATE).layout == SINGLE


def test_an_untagged_leader_lock_in_the_lease_table_makes_it_single(client, unique_name):
    untagged = {key: value for key, value in LEADER_LOCK.items() if key != "entityType"}
    kcl_lease_table(client, unique_name, LEASE, untagged)
    assert detect(client, unique_name).layout == SINGLE


def test_single_table_items_next_to_a_separate_table_are_refused_naming_both(client, unique_name):
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS, LEADER_LOCK)
    kcl_separate_table(client, f"{unique_name}-CoordinatorState", "key", {"key": {"S": "Leader"}})
    with pytest.raises(LayoutConflictError) as raised:
        detect(client, unique_name)
    message = str(raised.value)
    assert repr(unique_name) in message
    assert repr(f"{unique_name}-CoordinatorState") in message
    assert f"{unique_name}-WorkerMetricStats" not in message


def test_a_kcl_3_5_application_that_migrated_is_single_though_kcl_left_its_two_old_tables(client, unique_name):
    # KCL's migration writes COMPLETE to both tables in one transaction and deletes neither old table.
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS, LEADER_LOCK, TABLE_MIGRATION)
    migration = {key: value for key, value in TABLE_MIGRATION.items() if key not in ("leaseKey", "entityType")}
    legacy_state = {"key": {"S": "TableMigration3.5"}, **migration}
    kcl_separate_table(client, f"{unique_name}-CoordinatorState", "key", legacy_state)
    kcl_separate_table(client, f"{unique_name}-WorkerMetricStats", "wid", {"wid": {"S": "worker-1"}})
    decision = detect(client, unique_name, configured=SEPARATE)
    assert decision.layout == SINGLE
    assert "table migration is complete" in decision.reason
    assert repr(f"{unique_name}-CoordinatorState") in decision.reason


def test_a_migration_not_complete_beside_the_old_tables_is_still_refused(client, unique_name):
    pending = {**TABLE_MIGRATION, "tm": {"S": "TABLE_MIGRATION_STATUS_PENDING"}}
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS, pending)
    kcl_separate_table(client, f"{unique_name}-CoordinatorState", "key", {"key": {"S": "Leader"}})
    with pytest.raises(LayoutConflictError):
        detect(client, unique_name)


def test_the_lease_store_reads_only_the_leases_of_a_kcl_3_5_single_table_lease_table(moto_endpoint, unique_name):
    store = dynamodb_store(moto_endpoint, unique_name)
    untagged_leader = {key: value for key, value in LEADER_LOCK.items() if key != "entityType"}
    for item in (LEASE, WORKER_METRIC_STATS, untagged_leader, TABLE_MIGRATION):
        put_raw_item(store, item)
    leases = store.list_leases()
    assert [lease.lease_key for lease in leases] == ["shardId-000000000008"]
    assert leases[0].checkpoint == LATEST
    assert store.get_lease("Leader", consistent=True) is None
    assert store.get_lease("TableMigration3.5", consistent=True) is None


def test_a_separate_layout_is_detected_without_scanning_the_lease_table(moto_endpoint, client, unique_name):
    dynamodb_store(moto_endpoint, unique_name, layout="separate")
    counting = FaultInjectingClient(client, lambda method, number: None)
    assert detect(counting, unique_name).layout == SEPARATE
    assert counting.calls.get("scan", 0) == 0


def test_a_single_layout_holding_the_round_counter_is_detected_without_scanning(client, unique_name):
    round_counter = {"leaseKey": {"S": "AssignmentRound"}, "round": {"N": "3"}, "entityType": {"S": "LEADER"}}
    kcl_lease_table(client, unique_name, LEASE, round_counter)
    counting = FaultInjectingClient(client, lambda method, number: None)
    assert detect(counting, unique_name, configured=SEPARATE).layout == SINGLE
    assert counting.calls.get("scan", 0) == 0


def test_a_kcl_3_5_lease_table_with_only_worker_metrics_beside_its_leases_is_found_by_a_scan(client, unique_name):
    kcl_lease_table(client, unique_name, LEASE, WORKER_METRIC_STATS)
    counting = FaultInjectingClient(client, lambda method, number: None)
    assert detect(counting, unique_name, configured=SEPARATE).layout == SINGLE
    assert counting.calls["scan"] >= 1
