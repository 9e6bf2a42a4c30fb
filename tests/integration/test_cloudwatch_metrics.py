"""The round's metrics published to CloudWatch (moto's, on loopback) and read back with GetMetricData: KCL's
names and dimensions, requests of up to 1,000 values, throttling retried, and a failure reported, never raised.

Each test has a moto server of its own: moto's GetMetricData (5.2.5) ignores the namespace of a query that
names dimensions, so the values of another test's namespace would be read back with this one's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devtools.emulators import moto_server
from devtools.fault_proxy import FaultProxy, FaultRule
from lease_core import aws
from lease_core.config.settings import ConsumerConfig
from lease_core.metrics.cloudwatch import CloudWatchPublisher
from lease_core.metrics.round_metrics import MetricsLevel, round_metric_values
from lease_core.retry import RetryPolicy
from tests.support.observed_rounds import observed_round

RETRIES = RetryPolicy(attempts=6, base_millis=1, max_millis=20)


def cloudwatch(endpoint: str) -> Any:
    """A client as the application builds one (`lease_core.aws.client`: botocore's own retries off)."""
    return aws.client("cloudwatch", ConsumerConfig(aws_region="us-east-1", aws_endpoint_url_cloudwatch=endpoint))


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
def cloudwatch_endpoint() -> Iterator[str]:
    with moto_server() as server:
        yield server.endpoint


@pytest.fixture
def throttling_proxy(cloudwatch_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(cloudwatch_endpoint, seed=3) as proxy:
        yield proxy


def test_a_rounds_metrics_read_back_from_cloudwatch_under_kcls_names_and_dimensions(cloudwatch_endpoint, unique_name):
    client = cloudwatch(cloudwatch_endpoint)
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


def test_the_enabled_dimensions_decide_what_cloudwatch_holds_and_what_is_added_up(cloudwatch_endpoint, unique_name):
    client = cloudwatch(cloudwatch_endpoint)
    publisher = CloudWatchPublisher(client, unique_name, MetricsLevel.SUMMARY, ["Operation"], RETRIES)
    publisher.publish(round_metric_values(observed_round(unique_name, 4, now_millis())), now_millis())

    dimensions = {
        tuple(dimension["Name"] for dimension in metric["Dimensions"]) for metric in every_metric(client, unique_name)
    }
    assert dimensions == {("Operation",)}
    assert read_back(client, unique_name, "ProcessTask", "RecordsProcessed", "Sum") == [10.0]
    assert read_back(client, unique_name, "ProcessTask", "ReadCalls", "Sum") == []  # DETAILED, not published


def test_more_values_than_one_request_holds_go_in_requests_of_a_thousand_and_all_arrive(
    cloudwatch_endpoint, unique_name
):
    client = cloudwatch(cloudwatch_endpoint)
    values = round_metric_values(observed_round(unique_name, 250, now_millis()))
    published = CloudWatchPublisher(client, unique_name, MetricsLevel.DETAILED, ["ALL"], RETRIES).publish(
        values, now_millis()
    )

    assert len(values) > 2000
    assert (published.calls, published.published, published.error) == (3, len(values), None)
    assert len(every_metric(client, unique_name)) == len(values)


def test_throttled_calls_are_retried_until_they_get_through(throttling_proxy, cloudwatch_endpoint, unique_name):
    throttling_proxy.set_faults([FaultRule("throttle", 0.5, "PutMetricData")])
    client = cloudwatch(throttling_proxy.endpoint)
    values = round_metric_values(observed_round(unique_name, 250, now_millis()))
    published = CloudWatchPublisher(client, unique_name, MetricsLevel.DETAILED, ["ALL"], RETRIES).publish(
        values, now_millis()
    )

    assert throttling_proxy.stats()["throttle:PutMetricData"] > 0
    assert (published.published, published.error) == (len(values), None)
    assert len(every_metric(cloudwatch(cloudwatch_endpoint), unique_name)) == len(values)


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
