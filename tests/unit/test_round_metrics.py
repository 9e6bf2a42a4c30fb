"""The round's metrics: KCL's names where KCL has them, the values a round gives, KCL's level and dimension
filters, and CloudWatch's requests."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from lease_core.metrics.cloudwatch import MAX_DATA_PER_CALL, cloudwatch_batches, metric_datum
from lease_core.metrics.freshness import Freshness
from lease_core.metrics.round_metrics import (
    METRICS,
    LeaseObservation,
    MetricsLevel,
    MetricValue,
    RoundObservation,
    SlotObservation,
    StatisticSet,
    kcl_filtered,
    metric,
    round_metric_values,
)

END = 1_800_000_000_000
APP = "orders"


def lease(shard: str, worker: int = 0, **changes) -> LeaseObservation:
    base = LeaseObservation(
        lease_key=shard,
        shard_id=shard,
        worker_id=f"{APP}-worker-{worker}",
        records=10,
        bytes=1000,
        seconds=2.5,
        millis_behind_latest=0,
        read_calls=3,
        refused_read_calls=1,
        dead_lettered=0,
        failed=False,
        lost=False,
        freshness=Freshness(END - 4000, END - 6000),
    )
    return replace(base, **changes)


def consumed_round(*leases: LeaseObservation, **changes) -> RoundObservation:
    base = RoundObservation(
        application=APP,
        finished_at_millis=END,
        idle=False,
        succeeded=True,
        consumed=True,
        seconds=12.0,
        records=sum(item.records for item in leases),
        bytes=sum(item.bytes for item in leases),
        dead_lettered=0,
        lost_leases=sum(item.lost for item in leases),
        retention_losses=0,
        freshness=Freshness.of_leases(item.freshness for item in leases),
        total_leases=len(leases),
        workers=2,
        moves=1,
        leases=leases,
        slots=(SlotObservation(f"{APP}-worker-0", 11.0), SlotObservation(f"{APP}-worker-1", 9.0)),
    )
    return replace(base, **changes)


def values_of(values: list[MetricValue], operation: str, name: str) -> list[MetricValue]:
    return [value for value in values if value.metric.operation == operation and value.metric.name == name]


def by_dimension(values: list[MetricValue], operation: str, name: str, dimension: str) -> dict[str, float]:
    return {dict(value.dimensions)[dimension]: value.statistics.sum for value in values_of(values, operation, name)}


def only(values: list[MetricValue], operation: str, name: str) -> MetricValue:
    (value,) = values_of(values, operation, name)
    return value


# KCL's own (amazon-kinesis-client: ProcessTask, DynamoDBLeaseRenewer, LeaseAssignmentManager).
KCL_METRICS = [
    ("ProcessTask", "RecordsProcessed", "Count", MetricsLevel.SUMMARY),
    ("ProcessTask", "DataBytesProcessed", "Bytes", MetricsLevel.SUMMARY),
    ("ProcessTask", "MillisBehindLatest", "Milliseconds", MetricsLevel.SUMMARY),
    ("ProcessTask", "Success", "Count", MetricsLevel.SUMMARY),
    ("ProcessTask", "Time", "Milliseconds", MetricsLevel.SUMMARY),
    ("ApplicationTracker", "MillisBehindLatest", "Milliseconds", MetricsLevel.SUMMARY),
    ("RenewAllLeases", "CurrentLeases", "Count", MetricsLevel.SUMMARY),
    ("RenewAllLeases", "LostLeases", "Count", MetricsLevel.SUMMARY),
    ("LeaseAssignmentManager", "TotalLeases", "Count", MetricsLevel.SUMMARY),
    ("LeaseAssignmentManager", "NumWorkers", "Count", MetricsLevel.SUMMARY),
    ("LeaseAssignmentManager", "NumOfLeasesReassignment", "Count", MetricsLevel.SUMMARY),
]


@pytest.mark.parametrize(("operation", "name", "unit", "level"), KCL_METRICS, ids=str)
def test_a_metric_kcl_publishes_has_kcls_operation_name_unit_and_level(operation, name, unit, level):
    defined = metric(operation, name)
    assert (defined.unit.value, defined.level, defined.kcl) == (unit, level, True)


def test_every_metric_is_defined_once_with_a_meaning():
    keys = [(item.operation, item.name) for item in METRICS]
    assert len(keys) == len(set(keys))
    assert all(item.meaning.strip() for item in METRICS)


def test_an_undefined_metric_is_refused_naming_it():
    with pytest.raises(KeyError, match="no metric 'RecordsLost' of operation 'Round'"):
        metric("Round", "RecordsLost")


def test_a_leases_values_carry_its_shard_id_and_no_stream_id_in_single_stream_mode():
    values = round_metric_values(consumed_round(lease("shardId-000000000001")))
    records = only(values, "ProcessTask", "RecordsProcessed")
    assert records.all_dimensions == (("Operation", "ProcessTask"), ("ShardId", "shardId-000000000001"))
    assert records.statistics == StatisticSet(1, 10.0, 10.0, 10.0)


def test_a_multi_stream_leases_values_carry_kcls_stream_identifier():
    key = "123456789012:orders:1700000000:shardId-000000000001"
    values = round_metric_values(consumed_round(lease("shardId-000000000001", lease_key=key)))
    assert dict(only(values, "ProcessTask", "DataBytesProcessed").dimensions) == {
        "ShardId": "shardId-000000000001",
        "StreamId": "123456789012:orders:1700000000",
    }


def test_the_applications_millis_behind_latest_is_one_sample_per_lease_that_reported_one():
    leases = (
        lease("shardId-1", millis_behind_latest=0),
        lease("shardId-2", millis_behind_latest=4000),
        lease("shardId-3", millis_behind_latest=None),
    )
    tracker = only(round_metric_values(consumed_round(*leases)), "ApplicationTracker", "MillisBehindLatest")
    assert tracker.dimensions == ()
    assert tracker.statistics == StatisticSet(2, 4000.0, 0.0, 4000.0)


def test_an_idle_round_is_caught_up_and_idle_with_no_lease_or_slot_values():
    idle = consumed_round(idle=True, consumed=False, leases=(), slots=(), total_leases=None, workers=None, moves=None)
    values = round_metric_values(replace(idle, freshness=Freshness(END, END - 60_000)))
    assert only(values, "ApplicationTracker", "MillisBehindLatest").statistics.maximum == 0
    assert only(values, "Round", "Idle").statistics.sum == 1
    assert only(values, "Round", "OldestUnlandedRecordAge").statistics.sum == 0
    assert only(values, "Round", "NewestLandedRecordAge").statistics.sum == 60_000
    assert {value.metric.operation for value in values} == {"Round", "ApplicationTracker"}


def test_a_failed_and_a_lost_lease_count_as_unsuccessful_and_the_lost_one_is_its_slots_lost_lease():
    leases = (lease("shardId-1", failed=True), lease("shardId-2", lost=True), lease("shardId-3", worker=1))
    values = round_metric_values(consumed_round(*leases))
    success = {
        dict(value.dimensions)["ShardId"]: value.statistics.sum for value in values_of(values, "ProcessTask", "Success")
    }
    assert success == {"shardId-1": 0, "shardId-2": 0, "shardId-3": 1}
    held = {
        dict(value.dimensions)["WorkerIdentifier"]: value.statistics.sum
        for value in values_of(values, "RenewAllLeases", "CurrentLeases")
    }
    lost = {
        dict(value.dimensions)["WorkerIdentifier"]: value.statistics.sum
        for value in values_of(values, "RenewAllLeases", "LostLeases")
    }
    assert held == {f"{APP}-worker-0": 2, f"{APP}-worker-1": 1}
    assert lost == {f"{APP}-worker-0": 1, f"{APP}-worker-1": 0}


def test_freshness_is_the_age_at_the_rounds_end_and_left_out_where_unknown():
    leases = (lease("shardId-1"), lease("shardId-2", freshness=Freshness()))
    values = round_metric_values(consumed_round(*leases))
    oldest = values_of(values, "ProcessTask", "OldestUnlandedRecordAge")
    assert [(dict(value.dimensions)["ShardId"], value.statistics.sum) for value in oldest] == [("shardId-1", 4000)]
    assert only(values, "Round", "NewestLandedRecordAge").statistics.sum == 6000


def test_a_round_whose_report_was_never_read_publishes_only_the_applications_figures():
    failed = consumed_round(succeeded=False, consumed=False, leases=(), slots=(), total_leases=None, workers=None)
    values = round_metric_values(replace(failed, moves=None))
    assert only(values, "Round", "Success").statistics.sum == 0
    assert (
        values_of(values, "Round", "Time") == [] and values_of(values, "ApplicationTracker", "MillisBehindLatest") == []
    )


# --- KCL's filters ---------------------------------------------------------------------------------


def test_summary_drops_the_detailed_metrics_and_none_drops_everything():
    values = round_metric_values(consumed_round(lease("shardId-1")))
    summary = kcl_filtered(values, MetricsLevel.SUMMARY, ["ALL"])
    assert {value.metric.level for value in summary} == {MetricsLevel.SUMMARY}
    assert values_of(summary, "ProcessTask", "ReadCalls") == []
    assert len(kcl_filtered(values, MetricsLevel.DETAILED, ["ALL"])) == len(values)
    assert kcl_filtered(values, MetricsLevel.NONE, ["ALL"]) == []


def test_values_left_with_the_same_dimensions_by_a_disabled_dimension_are_added_up():
    leases = (lease("shardId-1", records=10), lease("shardId-2", records=5, millis_behind_latest=700))
    values = round_metric_values(consumed_round(*leases))
    kept = kcl_filtered(values, MetricsLevel.DETAILED, ["Operation"])
    assert only(kept, "ProcessTask", "RecordsProcessed").statistics == StatisticSet(2, 15.0, 5.0, 10.0)
    assert only(kept, "ProcessTask", "MillisBehindLatest").statistics == StatisticSet(2, 700.0, 0.0, 700.0)
    assert only(kept, "RenewAllLeases", "CurrentLeases").dimensions == ()


def test_operation_is_kept_whatever_the_enabled_dimensions_and_the_listed_ones_stay():
    values = round_metric_values(consumed_round(lease("shardId-1")))
    kept = kcl_filtered(values, MetricsLevel.SUMMARY, ["ShardId"])
    assert only(kept, "ProcessTask", "RecordsProcessed").all_dimensions == (
        ("Operation", "ProcessTask"),
        ("ShardId", "shardId-1"),
    )
    assert {value.dimensions for value in values_of(kept, "RenewAllLeases", "CurrentLeases")} == {()}


# --- CloudWatch's requests -------------------------------------------------------------------------


def test_a_value_is_sent_as_kcl_sends_it_a_statistic_set_with_its_unit_and_operation_first():
    at = datetime.fromtimestamp(END / 1000, UTC)
    value = only(round_metric_values(consumed_round(lease("shardId-1"))), "ProcessTask", "DataBytesProcessed")
    assert metric_datum(value, at) == {
        "MetricName": "DataBytesProcessed",
        "Dimensions": [{"Name": "Operation", "Value": "ProcessTask"}, {"Name": "ShardId", "Value": "shardId-1"}],
        "Timestamp": at,
        "Unit": "Bytes",
        "StatisticValues": {"SampleCount": 1.0, "Sum": 1000.0, "Minimum": 1000.0, "Maximum": 1000.0},
    }


def test_values_go_in_requests_of_at_most_a_thousand_in_their_order():
    values = round_metric_values(consumed_round(*(lease(f"shardId-{index}") for index in range(250))))
    batches = list(cloudwatch_batches(values, datetime.fromtimestamp(END / 1000, UTC)))
    assert [len(batch) for batch in batches[:-1]] == [MAX_DATA_PER_CALL] * (len(batches) - 1)
    assert sum(len(batch) for batch in batches) == len(values) > 2 * MAX_DATA_PER_CALL
    assert [datum["MetricName"] for batch in batches for datum in batch] == [value.metric.name for value in values]
