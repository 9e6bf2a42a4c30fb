"""SubscribeToShard served by the fault proxy from kinesis-mock (devtools/subscription_bridge.py), read by
boto3 as an enhanced fan-out consumer reads it: the records written, a split shard's end in both the
ways Kinesis ends a shard, the service's one-subscription rule with its 5 s in-use window, a consumer
that is gone, and the cuts the fault campaign makes (a reset connection, an exception event)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.exceptions
import pytest
import urllib3.exceptions
from botocore.config import Config

from devtools.fault_proxy import FaultProxy
from devtools.kinesis_streams import create_stream, kinesis_client, put_records, split_shard

ONE_ATTEMPT = Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=30)
SHARD = "shardId-000000000000"


@pytest.fixture
def proxy(kinesis_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(kinesis_endpoint) as running:
        running.serve_subscriptions(heartbeat_seconds=0.2, poll_seconds=0.05)
        yield running


@pytest.fixture
def stream(kinesis_endpoint: str, unique_name: str) -> str:
    create_stream(kinesis_client(kinesis_endpoint), unique_name, 1)
    return unique_name


def stream_arn(client: Any, stream: str) -> str:
    return str(client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"])


def register(client: Any, stream: str) -> str:
    consumer = client.register_stream_consumer(StreamARN=stream_arn(client, stream), ConsumerName="app")["Consumer"]
    while (
        client.describe_stream_consumer(ConsumerARN=consumer["ConsumerARN"])["ConsumerDescription"]["ConsumerStatus"]
        != "ACTIVE"
    ):
        time.sleep(0.1)
    return str(consumer["ConsumerARN"])


def subscriber(proxy: FaultProxy) -> Any:
    return boto3.client("kinesis", endpoint_url=proxy.endpoint, region_name="us-east-1", config=ONE_ATTEMPT)


def subscribe(proxy: FaultProxy, consumer: str, shard: str = SHARD) -> Iterator[dict[str, Any]]:
    answer = subscriber(proxy).subscribe_to_shard(
        ConsumerARN=consumer, ShardId=shard, StartingPosition={"Type": "TRIM_HORIZON"}
    )
    return (event["SubscribeToShardEvent"] for event in answer["EventStream"])


@pytest.mark.parametrize("late_end", [False, True], ids=["with_last_records", "after_last_records"])
def test_a_subscription_pushes_the_records_written_then_the_split_shards_end_with_its_children(
    kinesis_endpoint, proxy, stream, late_end
):
    client = kinesis_client(kinesis_endpoint)
    consumer = register(client, stream)
    written = put_records(client, stream, 20)[SHARD]
    children = split_shard(client, stream, SHARD)
    proxy.end_shards_after_last_records(late_end)
    events = list(subscribe(proxy, consumer))
    assert [record["SequenceNumber"] for event in events for record in event["Records"]] == written
    assert events[-1].get("ContinuationSequenceNumber") is None
    assert sorted(child["ShardId"] for child in events[-1]["ChildShards"]) == sorted(children)
    assert all(event.get("ContinuationSequenceNumber") for event in events[:-1])
    assert (events[-1]["Records"] == []) is late_end


def test_a_second_subscription_within_five_seconds_is_refused_and_a_later_one_takes_the_shard_over(
    kinesis_endpoint, proxy, stream
):
    consumer = register(kinesis_client(kinesis_endpoint), stream)
    first = subscribe(proxy, consumer)
    next(first)
    with pytest.raises(botocore.exceptions.ClientError, match="ResourceInUseException"):
        subscribe(proxy, consumer)
    time.sleep(5.2)
    second = subscribe(proxy, consumer)
    with pytest.raises(botocore.exceptions.EventStreamError, match="ResourceInUseException"):
        for _ in first:
            pass
    assert next(second)["Records"] == []


def test_a_deregistered_consumers_open_subscription_ends_with_resource_not_found_and_a_new_one_is_refused(
    kinesis_endpoint, proxy, stream
):
    client = kinesis_client(kinesis_endpoint)
    consumer = register(client, stream)
    events = subscribe(proxy, consumer)
    next(events)
    client.deregister_stream_consumer(ConsumerARN=consumer)
    with pytest.raises(botocore.exceptions.EventStreamError, match="ResourceNotFoundException"):
        for _ in events:
            pass
    # DELETING (not ACTIVE), then gone: refused either way
    with pytest.raises(botocore.exceptions.ClientError, match=r"ResourceInUseException|ResourceNotFoundException"):
        subscribe(proxy, consumer)


def test_a_cut_subscription_ends_mid_stream_by_a_reset_connection_or_an_exception_event(
    kinesis_endpoint, proxy, stream
):
    consumer = register(kinesis_client(kinesis_endpoint), stream)
    bridge = proxy.subscriptions()
    assert bridge is not None
    events = subscribe(proxy, consumer)
    next(events)
    assert bridge.cut(stream, SHARD, "reset") == 1
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for _ in events:
            pass
    time.sleep(5.2)  # the reset subscription counted as open until its connection closed
    events = subscribe(proxy, consumer)
    next(events)
    assert bridge.cut(stream, SHARD, "InternalFailureException") == 1
    with pytest.raises(botocore.exceptions.EventStreamError, match="InternalFailureException"):
        for _ in events:
            pass
