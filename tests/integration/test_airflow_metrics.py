"""The round's metrics through Airflow's own metrics backend, configured as a deployment configures it
(`[metrics] statsd_on`, host, port, prefix), arriving at a real StatsD daemon (npm statsd) started here:
names, values, the legacy names with the application and shard in them, counters, gauges and timers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
from airflow.sdk.observability import stats
from kinesis_lease.airflow_metrics import emit_round_metrics

from lease_core.metrics.round_metrics import round_metric_values
from tests.support.observed_rounds import observed_round
from tests.support.statsd_daemon import StatsdDaemon, airflow_metrics_to, statsd_daemon

END = 1_800_000_000_000
SHARD_1 = "shardId-000000000001"


@pytest.fixture(scope="module")
def daemon() -> Iterator[StatsdDaemon]:
    with statsd_daemon() as running:
        yield running


def test_every_value_arrives_under_its_name_with_the_application_and_its_shard_or_slot_in_it(daemon, unique_name):
    application = unique_name.replace("-", ".")  # a dot in a name's part becomes two underscores
    values = round_metric_values(observed_round(application, 2, END))

    with airflow_metrics_to(daemon):
        sent = emit_round_metrics(values, application)

    assert sent == {"values": len(values), "sent": len(values), "error": None}
    named = f"airflow.kinesis_lease.{{}}.{unique_name.replace('-', '__')}"
    counters, gauges, timers = daemon.counters(), daemon.gauges(), daemon.timers()
    assert counters[named.format("ProcessTask.RecordsProcessed") + f".{SHARD_1}"] == 2
    assert counters[named.format("ProcessTask.DataBytesProcessed") + f".{SHARD_1}"] == 200
    assert counters[named.format("Round.RecordsProcessed")] == 3
    assert gauges[named.format("ProcessTask.MillisBehindLatest") + f".{SHARD_1}"] == 1000
    assert gauges[named.format("ApplicationTracker.MillisBehindLatest")] == 1000  # the largest of the shards'
    assert gauges[named.format("Round.OldestUnlandedRecordAge")] == 1500
    assert gauges[named.format("Round.NewestLandedRecordAge")] == 700
    assert gauges[named.format("RenewAllLeases.CurrentLeases") + f".{application.replace('.', '__')}-worker-1"] == 1
    assert timers[named.format("Round.Time")] == [20_000]
    assert timers[named.format("ProcessTask.Time") + f".{SHARD_1}"] == [1500]


def test_the_names_without_the_application_add_up_every_shard_as_tags_would_be_dropped(daemon, unique_name):
    before: dict[str, Any] = daemon.counters()
    values = round_metric_values(observed_round(unique_name, 3, END))

    with airflow_metrics_to(daemon, legacy_names=False):
        emit_round_metrics(values, unique_name)

    counters = daemon.counters()
    records = "airflow.kinesis_lease.ProcessTask.RecordsProcessed"
    assert counters[records] - before.get(records, 0) == 1 + 2 + 3
    assert not [name for name in counters if unique_name in name]  # no name with the application in it


def test_a_backend_that_fails_is_reported_in_the_summary_and_never_raised(unique_name):
    class RefusingBackend(NoStatsLogger):
        @classmethod
        def incr(cls, *args: Any, **kwargs: Any) -> None:
            raise OSError("Network is unreachable")

    values = round_metric_values(observed_round(unique_name, 2, END))
    stats.initialize(factory=RefusingBackend, export_legacy_names=False)
    try:
        sent = emit_round_metrics(values, unique_name)
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=True)

    assert sent["values"] == len(values) and sent["sent"] < len(values)
    assert sent["error"] == "OSError: Network is unreachable"
