"""The round's metrics published to CloudWatch (moto's, on loopback) and read back with GetMetricData: KCL's
names and dimensions, requests of up to 1,000 values, throttling retried, and a failure reported, never raised."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devtools.fault_proxy import FaultProxy, FaultRule
from lease_core import aws
from lease_core.config.settings import ConsumerConfig
from lease_core.metrics.cloudwatch import CloudWatchPublisher
from lease_core.metrics.freshness import Freshness
from lease_core.metrics.round_metrics import (
    LeaseObservation,
    MetricsLevel,
    RoundObservation,
    SlotObservation,
    round_metric_values,
)
from lease_core.retry import RetryPolicy

RETRIES = RetryPolicy(attempts=6, base_millis=1, max_millis=20)


def cloudwatch(endpoint: str) -> Any:
    """A client as the application builds one (`lease_core.aws.client`: botocore's own retries off)."""
    return aws.client("cloudwatch", ConsumerConfig(aws_region="us-east-1", aws_endpoint_url_cloudwatch=endpoint))


def observed_round(application: str, shards: int, end_millis: int) -> RoundObservation:
    """A consumed round over `shards` shards: shard i landed i + 1 records and is i seconds behind its tip."""
    leases = tuple(
        LeaseObservation(
            lease_key=f"shardId-{index:012d}",
            shard_id=f"shardId-{index:012d}",
            worker_id=f"{application}-worker-{index % 2}",
            records=index + 1,
            bytes=100 * (index + 1),
            seconds=1.5,
            millis_behind_latest=1000 * index,
            read_calls=2,
            refused_read_calls=0,
            dead_lettered=0,
            failed=False,
            lost=False,
            freshness=Freshness(end_millis - 1000 * index - 500, end_millis - 1000 * index - 700),
        )
        for index in range(shards)
    )
    return RoundObservation(
        application=application,
        finished_at_millis=end_millis,
        idle=False,
        succeeded=True,
        consumed=True,
        seconds=20.0,
        records=sum(lease.records for lease in leases),
        bytes=sum(lease.bytes for lease in leases),
        dead_lettered=0,
        lost_leases=0,
        retention_losses=0,
        freshness=Freshness.of_leases(lease.freshness for lease in leases),
        total_leases=shards,
        workers=2,
        moves=0,
        leases=leases,
        slots=(SlotObservation(f"{application}-worker-0", 18.0), SlotObservation(f"{application}-worker-1", 17.0)),
    )


def now_millis() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def read_back(client: Any, namespace: str, operation: str, name: str, stat: str, **dimensions: str) -> list[float]:
    """The values of one metric GetMetricData answers, over the last and the next ten minutes."""
    now = datetime.now(UTC)
    answer = client.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "m",
                "MetricStat": {
                    "Metric": {
                        "Namespace": namespace,
                        "MetricName": name,
                        "Dimensions": [
                            {"Name": "Operation", "Value": operation},
                            *({"Name": key, "Value": value} for key, value in dimensions.items()),
                        ],
                    },
                    "Period": 60,
                    "Stat": stat,
                },
            }
        ],
        StartTime=now - timedelta(minutes=10),
        EndTime=now + timedelta(minutes=10),
    )
    return list(answer["MetricDataResults"][0]["Values"])


def every_metric(client: Any, namespace: str) -> list[dict[str, Any]]:
    return [
        metric
        for page in client.get_paginator("list_metrics").paginate(Namespace=namespace)
        for metric in page["Metrics"]
    ]


@pytest.fixture
def throttling_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint, seed=3) as proxy:
        yield proxy


def test_a_rounds_metrics_read_back_from_cloudwatch_under_kcls_names_and_dimensions(moto_endpoint, unique_name):
    client = cloudwatch(moto_endpoint)
    publisher = CloudWatchPublisher(client, unique_name, MetricsLevel.DETAILED, ["ALL"], RETRIES)
    published = publisher.publish(round_metric_values(observed_round(unique_name, 4, now_millis())), now_millis())

    assert (published.error, published.calls, published.published) == (None, 1, published.values)
    shard = "shardId-000000000002"
    assert read_back(client, unique_name, "ProcessTask", "RecordsProcessed", "Sum", ShardId=shard) == [3.0]
    assert read_back(client, unique_name, "ProcessTask", "DataBytesProcessed", "Sum", ShardId=shard) == [300.0]
    assert read_back(client, unique_name, "ProcessTask", "MillisBehindLatest", "Maximum", ShardId=shard) == [2000.0]
    assert read_back(client, unique_name, "ApplicationTracker", "MillisBehindLatest", "Maximum") == [3000.0]
    assert read_back(client, unique_name, "ApplicationTracker", "MillisBehindLatest", "SampleCount") == [4.0]
    worker = f"{unique_name}-worker-1"
    assert read_back(client, unique_name, "RenewAllLeases", "CurrentLeases", "Maximum", WorkerIdentifier=worker) == [
        2.0
    ]
    assert read_back(client, unique_name, "Round", "OldestUnlandedRecordAge", "Maximum") == [3500.0]
    assert read_back(client, unique_name, "Round", "NewestLandedRecordAge", "Maximum") == [700.0]


def test_the_enabled_dimensions_decide_what_cloudwatch_holds_and_what_is_added_up(moto_endpoint, unique_name):
    client = cloudwatch(moto_endpoint)
    publisher = CloudWatchPublisher(client, unique_name, MetricsLevel.SUMMARY, ["Operation"], RETRIES)
    publisher.publish(round_metric_values(observed_round(unique_name, 4, now_millis())), now_millis())

    dimensions = {
        tuple(dimension["Name"] for dimension in metric["Dimensions"]) for metric in every_metric(client, unique_name)
    }
    assert dimensions == {("Operation",)}
    assert read_back(client, unique_name, "ProcessTask", "RecordsProcessed", "Sum") == [10.0]
    assert read_back(client, unique_name, "ProcessTask", "ReadCalls", "Sum") == []  # DETAILED, not published


def test_more_values_than_one_request_holds_go_in_requests_of_a_thousand_and_all_arrive(moto_endpoint, unique_name):
    client = cloudwatch(moto_endpoint)
    values = round_metric_values(observed_round(unique_name, 250, now_millis()))
    published = CloudWatchPublisher(client, unique_name, MetricsLevel.DETAILED, ["ALL"], RETRIES).publish(
        values, now_millis()
    )

    assert len(values) > 2000
    assert (published.calls, published.published, published.error) == (3, len(values), None)
    assert len(every_metric(client, unique_name)) == len(values)


def test_throttled_calls_are_retried_until_they_get_through(throttling_proxy, moto_endpoint, unique_name):
    throttling_proxy.set_faults([FaultRule("throttle", 0.5, "PutMetricData")])
    client = cloudwatch(throttling_proxy.endpoint)
    values = round_metric_values(observed_round(unique_name, 250, now_millis()))
    published = CloudWatchPublisher(client, unique_name, MetricsLevel.DETAILED, ["ALL"], RETRIES).publish(
        values, now_millis()
    )

    assert throttling_proxy.stats()["throttle:PutMetricData"] > 0
    assert (published.published, published.error) == (len(values), None)
    assert len(every_metric(cloudwatch(moto_endpoint), unique_name)) == len(values)


def test_a_cloudwatch_that_keeps_refusing_is_reported_with_what_was_not_published_and_nothing_is_raised(
    throttling_proxy, unique_name
):
    throttling_proxy.set_faults([FaultRule("throttle", 1.0, "PutMetricData")])
    client = cloudwatch(throttling_proxy.endpoint)
    values = round_metric_values(observed_round(unique_name, 250, now_millis()))
    published = CloudWatchPublisher(client, unique_name, MetricsLevel.DETAILED, ["ALL"], RETRIES).publish(
        values, now_millis()
    )

    assert (published.values, published.published, published.calls) == (len(values), 0, 1)
    assert published.error is not None and "PutMetricData" in published.error and "Throttling" in published.error
    assert throttling_proxy.stats()["throttle:PutMetricData"] == RETRIES.attempts


def test_an_unreachable_cloudwatch_is_reported_and_nothing_is_raised(unique_name):
    client = cloudwatch("http://127.0.0.1:9")  # the discard port: nothing listens
    values = round_metric_values(observed_round(unique_name, 2, now_millis()))
    published = CloudWatchPublisher(client, unique_name, MetricsLevel.SUMMARY, ["ALL"], RETRIES).publish(
        values, now_millis()
    )

    assert published.published == 0 and published.error is not None and "PutMetricData" in published.error


def test_metrics_level_none_makes_no_call(throttling_proxy, unique_name):
    client = cloudwatch(throttling_proxy.endpoint)
    values = round_metric_values(observed_round(unique_name, 2, now_millis()))
    published = CloudWatchPublisher(client, unique_name, MetricsLevel.NONE, ["ALL"], RETRIES).publish(
        values, now_millis()
    )

    assert (published.values, published.calls) == (0, 0)
    assert throttling_proxy.calls() == []
