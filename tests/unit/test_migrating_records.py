"""Records read from both tables and written to one while a table migration is under way."""

from __future__ import annotations

from decimal import Decimal

import pytest

from lease_core.store.lease_table_records import coordinator_state_records, worker_metrics_records
from lease_core.store.migrating_records import MigratingRecords
from lease_core.store.record_table import InMemoryRecordTable
from lease_core.store.table_migration import STAYS_IN_SEPARATE_TABLE


@pytest.fixture
def lease_table():
    return InMemoryRecordTable("app", "leaseKey")


def coordinator_state(lease_table, *, writes_to_lease_table: bool):
    separate = InMemoryRecordTable("app-CoordinatorState", "key")
    records = MigratingRecords(
        separate,
        coordinator_state_records(lease_table),
        writes_to_lease_table=writes_to_lease_table,
        pinned=STAYS_IN_SEPARATE_TABLE,
    )
    return separate, records


def worker_metrics(lease_table, *, writes_to_lease_table: bool):
    separate = InMemoryRecordTable("app-WorkerMetricStats", "wid")
    records = MigratingRecords(
        separate,
        worker_metrics_records(lease_table),
        writes_to_lease_table=writes_to_lease_table,
        newest_by=("round", "lut"),
    )
    return separate, records


def test_a_record_is_read_from_whichever_table_holds_it(lease_table):
    separate, records = coordinator_state(lease_table, writes_to_lease_table=True)
    separate.put("AssignmentRound", {"round": 3})
    coordinator_state_records(lease_table).put("RoundHistory", {"rounds": []})
    assert records.get("AssignmentRound")["round"] == 3
    assert records.get("RoundHistory")["rounds"] == []
    assert sorted(record["key"] for record in records.scan()) == ["AssignmentRound", "RoundHistory"]


def test_a_record_is_written_where_it_is_and_a_new_one_where_the_status_writes(lease_table):
    separate, records = coordinator_state(lease_table, writes_to_lease_table=True)
    separate.put("AssignmentRound", {"round": 3, "version": "a"})
    assert records.update("AssignmentRound", {"round": 4, "version": "b"}, expected={"version": "a"})
    assert separate.get("AssignmentRound")["round"] == 4
    assert records.put("StreamConsumers", {"claims": {}})
    assert separate.get("StreamConsumers") is None
    assert lease_table.get("StreamConsumers")["entityType"] == "LEADER"


def test_the_lock_and_the_migration_record_stay_in_the_separate_table(lease_table):
    separate, records = coordinator_state(lease_table, writes_to_lease_table=True)
    assert records.put("Leader", {"ownerName": "round-1"}, expected={"key": None})
    assert separate.get("Leader")["ownerName"] == "round-1"
    assert lease_table.get("Leader") is None
    assert records.delete("Leader", expected={"ownerName": "round-1"})
    assert separate.get("Leader") is None


def test_before_pending_new_records_go_to_the_separate_table(lease_table):
    separate, records = coordinator_state(lease_table, writes_to_lease_table=False)
    assert records.put("StreamConsumers", {"claims": {}})
    assert separate.get("StreamConsumers") is not None
    assert lease_table.get("StreamConsumers") is None


def test_a_worker_s_newest_metrics_are_its_metrics_and_its_write_goes_where_the_status_writes(lease_table):
    separate, records = worker_metrics(lease_table, writes_to_lease_table=True)
    separate.put("app-worker-0", {"lut": 100, "sts": {"C": [Decimal(10)]}})
    worker_metrics_records(lease_table).put("app-worker-0", {"lut": 90, "sts": {"C": [Decimal(99)]}})
    assert records.get("app-worker-0")["lut"] == 100
    assert records.update("app-worker-0", {"lut": 200, "sts": {"C": [Decimal(10), Decimal(20)]}})
    assert records.get("app-worker-0")["lut"] == 200
    assert separate.get("app-worker-0")["lut"] == 100
    assert [record["lut"] for record in records.scan()] == [200]


def test_a_stale_item_is_deleted_in_the_table_that_holds_it(lease_table):
    separate, records = worker_metrics(lease_table, writes_to_lease_table=True)
    separate.put("app-worker-9", {"lut": 100})
    assert records.delete("app-worker-9", expected={"lut": 100})
    assert separate.get("app-worker-9") is None


def test_a_record_kcl_s_migration_moved_without_its_tag_is_read_as_coordinator_state(lease_table):
    lease_table.put("AssignmentRound", {"round": 4})  # untagged, as KCL 3.5's move writes a record it does not know
    records = coordinator_state_records(lease_table)
    assert records.get("AssignmentRound")["round"] == 4
    assert records.update("AssignmentRound", {"round": 5})
    assert lease_table.get("AssignmentRound")["entityType"] == "LEADER"
