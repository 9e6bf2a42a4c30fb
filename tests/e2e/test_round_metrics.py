"""A round of the real DAG publishes its metrics where operators look: to CloudWatch (moto's) under KCL's
names and dimensions, and through Airflow's metrics backend to a StatsD daemon (npm statsd), both read
back here with the values the round's history holds; and a shard that stops landing shows in its
freshness, which crosses the alarm's bound while the healthy shard's stays under it.

The first test reads the Kinesis stand-in (devtools/kinesis_standin.py), which answers MillisBehindLatest
as Kinesis does (how far the last record returned lies behind the tip, by its arrival time), with a
backlog that arrived over the ten minutes before it started; a per-lease record limit leaves every
lease behind its tip. The second produces to kinesis-mock between rounds.

Airflow's task runner starts the metrics backend in each task process; `dag.test()` runs the tasks in
this one, so the test starts it here the same way, after pointing `[metrics]` at the daemon.

CloudWatch is a moto server of each test's own, which the AWS connection names for the service
(`service_config`): moto's GetMetricData (5.2.5) ignores the namespace of a query that names dimensions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest

from devtools.airflow_env import run_environment
from devtools.emulators import moto_server
from devtools.kinesis_standin import KinesisStandIn, Limits, StreamSpec
from devtools.kinesis_streams import create_stream, kinesis_client
from lease_core.leader.round_history import RoundHistory
from tests.support.airflow_dag import airflow_environment, consumed_cleanly, run_round
from tests.support.pipeline import ConsumerPipeline
from tests.support.statsd_daemon import StatsdDaemon, airflow_metrics_to, statsd_daemon
from tests.support.stores import dynamodb_state_store

SHARDS = ("shardId-000000000000", "shardId-000000000001")
LIMIT = 150

# The widgets' metrics of a CloudWatch dashboard built for a KCL application: per shard, the records,
# bytes, lag, success and time of ProcessTask; the application's lag; each worker's leases; the leader's
# view of leases and workers. Each is (metric name, dimensions), in the application's namespace.
KCL_DASHBOARD = [
    *(
        (name, {"Operation": "ProcessTask", "ShardId": shard})
        for shard in SHARDS
        for name in ("RecordsProcessed", "DataBytesProcessed", "MillisBehindLatest", "Success", "Time")
    ),
    ("MillisBehindLatest", {"Operation": "ApplicationTracker"}),
    *(
        (name, {"Operation": "RenewAllLeases", "WorkerIdentifier": "{application}-worker-" + str(slot)})
        for slot in (0, 1)
        for name in ("CurrentLeases", "LostLeases")
    ),
    *(
        (name, {"Operation": "LeaseAssignmentManager"})
        for name in ("TotalLeases", "NumWorkers", "NumOfLeasesReassignment")
    ),
]


@pytest.fixture(scope="module")
def daemon() -> Iterator[StatsdDaemon]:
    with statsd_daemon() as running:
        yield running


@pytest.fixture(scope="module")
def stream_name() -> str:
    return f"metrics-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def standin(stream_name: str) -> Iterator[KinesisStandIn]:
    spec = StreamSpec(stream_name, shards=len(SHARDS), records_per_shard=400, backlog_seconds=600.0)
    with KinesisStandIn([spec], Limits()) as running:
        yield running


@pytest.fixture
def cloudwatch_endpoint() -> Iterator[str]:
    with moto_server() as server:
        yield server.endpoint


def with_cloudwatch_at(variables: Mapping[str, str], endpoint: str) -> dict[str, str]:
    """The run's variables with CloudWatch at `endpoint` in the AWS connection (a service's own endpoint)."""
    connection = json.loads(variables["AIRFLOW_CONN_AWS_DEFAULT"])
    connection["extra"]["service_config"]["cloudwatch"] = {"endpoint_url": endpoint}
    return {**variables, "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(connection)}


@pytest.fixture
def rounds_on_the_standin(
    standin: KinesisStandIn,
    daemon: StatsdDaemon,
    moto_endpoint: str,
    cloudwatch_endpoint: str,
    spark_connection: dict[str, Any],
    spark_submit_environment: dict[str, str],
    airflow_metadata_db: None,
) -> Iterator[None]:
    """The DAG's runs read the stand-in, land in moto's S3 and publish to CloudWatch and the daemon."""
    variables = run_environment(standin.endpoint, moto_endpoint, spark_connection, spark_submit_environment)
    with airflow_environment(with_cloudwatch_at(variables, cloudwatch_endpoint)), airflow_metrics_to(daemon):
        yield


def cloudwatch(endpoint: str) -> Any:
    return boto3.client("cloudwatch", endpoint_url=endpoint, region_name="us-east-1")


def read_back(
    client: Any, namespace: str, name: str, dimensions: dict[str, str], stat: str = "Maximum", period: int = 60
) -> list[float]:
    """The values of one metric over the last hour, `period` seconds apart, oldest first."""
    now = datetime.now(UTC)
    query = {
        "Id": "m",
        "MetricStat": {
            "Metric": {
                "Namespace": namespace,
                "MetricName": name,
                "Dimensions": [{"Name": key, "Value": value} for key, value in dimensions.items()],
            },
            "Period": period,
            "Stat": stat,
        },
    }
    answer = client.get_metric_data(
        MetricDataQueries=[query], StartTime=now - timedelta(hours=1), EndTime=now + timedelta(minutes=5)
    )
    result = answer["MetricDataResults"][0]
    return [value for _, value in sorted(zip(result["Timestamps"], result["Values"]))]


def history_of(moto_endpoint: str, application: str) -> RoundHistory:
    return RoundHistory(dynamodb_state_store(moto_endpoint, application))


def test_a_round_on_the_standin_publishes_its_figures_to_cloudwatch_under_kcls_names_and_to_statsd(
    dag, rounds_on_the_standin, daemon, stream_name, moto_endpoint, cloudwatch_endpoint, tmp_path
):
    conf = {
        "streams": [stream_name],
        "application_name": stream_name,
        "num_workers": 2,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
        "max_records_per_lease": LIMIT,
    }
    assert consumed_cleanly(run_round(dag, conf))

    history = history_of(moto_endpoint, stream_name)
    entry = history.rounds()[-1]
    rows = {row["shard_id"]: row for row in history.lease_rows()[1]}
    published = entry["metrics"]["cloudwatch"]
    assert published["error"] is None and published["published"] == published["values"] > 0
    assert entry["metrics"]["airflow"]["error"] is None
    client = cloudwatch(cloudwatch_endpoint)
    for shard in SHARDS:
        per_shard = {"Operation": "ProcessTask", "ShardId": shard}
        assert read_back(client, stream_name, "RecordsProcessed", per_shard, "Sum") == [LIMIT]
        behind = rows[shard]["millis_behind_latest"]
        assert behind > 0 and read_back(client, stream_name, "MillisBehindLatest", per_shard) == [behind]
        oldest = rows[shard]["oldest_unlanded_age_millis"]
        assert oldest >= behind and read_back(client, stream_name, "OldestUnlandedRecordAge", per_shard) == [oldest]
    tracker = {"Operation": "ApplicationTracker"}
    assert read_back(client, stream_name, "MillisBehindLatest", tracker) == [entry["max_millis_behind_latest"]]
    assert read_back(client, stream_name, "MillisBehindLatest", tracker, "SampleCount") == [len(SHARDS)]
    round_ = {"Operation": "Round"}
    assert read_back(client, stream_name, "OldestUnlandedRecordAge", round_) == [entry["oldest_unlanded_age_millis"]]
    assert read_back(client, stream_name, "NewestLandedRecordAge", round_) == [entry["newest_landed_age_millis"]]
    assert read_back(client, stream_name, "Success", round_) == [1]

    listed = client.get_paginator("list_metrics").paginate(Namespace=stream_name)
    present = {
        (metric["MetricName"], tuple(sorted((d["Name"], d["Value"]) for d in metric["Dimensions"])))
        for page in listed
        for metric in page["Metrics"]
    }
    for name, dimensions in KCL_DASHBOARD:
        wanted = {key: value.format(application=stream_name) for key, value in dimensions.items()}
        assert (name, tuple(sorted(wanted.items()))) in present, f"the KCL dashboard's {name} {wanted} is missing"

    daemon.settle()
    counters, gauges = daemon.counters(), daemon.gauges()
    named = f"airflow.kinesis_lease.{{}}.{stream_name}"
    for shard in SHARDS:
        assert counters[named.format("ProcessTask.RecordsProcessed") + f".{shard}"] == LIMIT
        assert (
            gauges[named.format("ProcessTask.MillisBehindLatest") + f".{shard}"] == rows[shard]["millis_behind_latest"]
        )
    assert gauges[named.format("ApplicationTracker.MillisBehindLatest")] == entry["max_millis_behind_latest"]
    assert gauges[named.format("Round.OldestUnlandedRecordAge")] == entry["oldest_unlanded_age_millis"]
    assert counters[named.format("Round.RecordsProcessed")] == LIMIT * len(SHARDS)


@pytest.fixture
def rounds_on_kinesis_mock(
    kinesis_endpoint: str,
    moto_endpoint: str,
    cloudwatch_endpoint: str,
    spark_connection: dict[str, Any],
    spark_submit_environment: dict[str, str],
    airflow_metadata_db: None,
) -> Iterator[None]:
    variables = run_environment(kinesis_endpoint, moto_endpoint, spark_connection, spark_submit_environment)
    with airflow_environment(with_cloudwatch_at(variables, cloudwatch_endpoint)):
        yield


def test_a_shard_that_stops_landing_crosses_the_freshness_bound_while_the_healthy_shard_stays_under_it(
    dag, rounds_on_kinesis_mock, kinesis_endpoint, moto_endpoint, cloudwatch_endpoint, unique_name, tmp_path
):
    create_stream(kinesis_client(kinesis_endpoint), unique_name, len(SHARDS))
    ledger = ConsumerPipeline(unique_name, (unique_name,), kinesis_endpoint, moto_endpoint, str(tmp_path / "lake"))
    conf = {
        "streams": [unique_name],
        "application_name": unique_name,
        "num_workers": 1,
        "initial_position": "TRIM_HORIZON",
        "output_uri": str(tmp_path / "lake"),
        # Every batch of the first shard fails: its lease fails for good in every round, the other lands.
        "transform": "tests.support.transforms:failing_on_the_first_shard",
    }
    history = history_of(moto_endpoint, unique_name)
    rounds = []
    for _ in range(3):
        ledger.produce(40)
        states = run_round(dag, conf)
        assert (states["consume"], states["record_failed_round"]) == ("failed", "success")
        entry = history.rounds()[-1]
        rows = {row["shard_id"]: row for row in history.lease_rows()[1]}
        rounds.append((entry, rows))

    stalled, healthy = SHARDS
    # The alarm of docs/operating.md: older than twice the schedule's interval (here the rounds' own).
    bound = 2 * (rounds[1][0]["finished_at"] - rounds[0][0]["finished_at"])
    stalled_ages = [rows[stalled]["oldest_unlanded_age_millis"] for _, rows in rounds]
    healthy_ages = [rows[healthy]["oldest_unlanded_age_millis"] for _, rows in rounds]
    assert stalled_ages[0] < bound < stalled_ages[2] and stalled_ages == sorted(stalled_ages)
    assert max(healthy_ages) < bound
    # The application's age is its least advanced lease's.
    assert [entry["oldest_unlanded_age_millis"] for entry, _ in rounds] == stalled_ages
    assert [entry["succeeded"] for entry, _ in rounds] == [False] * 3

    client = cloudwatch(cloudwatch_endpoint)

    def hours_worst(name: str, **dimensions: str) -> list[float]:
        return read_back(client, unique_name, name, dimensions, "Maximum", period=3600)

    oldest = "OldestUnlandedRecordAge"
    assert hours_worst(oldest, Operation="ProcessTask", ShardId=stalled)[-1] > bound
    assert hours_worst(oldest, Operation="ProcessTask", ShardId=healthy)[-1] < bound
    assert hours_worst(oldest, Operation="Round")[-1] > bound
    assert set(hours_worst("Success", Operation="Round")) == {0}
