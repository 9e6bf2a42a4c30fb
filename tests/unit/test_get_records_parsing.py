"""The fast GetRecords decoding of lease_core's clients returns exactly what botocore's own parser returns,
on any body Kinesis could send, and leaves errors and every other response to botocore; its columns
split into the user records botocore's records make (KPL aggregates included)."""

from __future__ import annotations

import base64
import json
from typing import Any

import botocore.parsers
import botocore.session
import pytest
from aws_kinesis_agg.deaggregator import iter_deaggregate_records
from hypothesis import given, settings
from hypothesis import strategies as st

from lease_core import aws
from lease_core.model.kinesis_record_columns import KinesisRecordColumns
from lease_core.retrieval.kpl_deaggregation import user_record_columns, user_records
from tests.support.kpl import aggregate

MODEL = botocore.session.get_session().get_service_model("kinesis")
GET_RECORDS = MODEL.operation_model("GetRecords")


def parsed_by_both(body: bytes, status: int = 200, operation: Any = GET_RECORDS) -> tuple[Any, Any]:
    """(botocore's parse, the fast session's parse) of one HTTP response to `operation`."""
    response = {"status_code": status, "headers": {"x-amzn-requestid": "r-1"}, "body": body}
    fast_factory = aws.FastGetRecordsParsers()
    return (
        botocore.parsers.create_parser("json").parse(dict(response), operation.output_shape),
        fast_factory.create_parser("json").parse(dict(response), operation.output_shape),
    )


digits = st.text("0123456789", min_size=1, max_size=56)
records = st.fixed_dictionaries(
    {
        "SequenceNumber": digits,
        "Data": st.binary(max_size=64).map(lambda data: base64.b64encode(data).decode()),
    },
    optional={
        "PartitionKey": st.text(max_size=20),
        "ApproximateArrivalTimestamp": st.one_of(
            st.integers(0, 4_000_000_000), st.floats(0, 4_000_000_000, allow_nan=False), st.none()
        ),
        "EncryptionType": st.sampled_from(["NONE", "KMS"]),
        "SomethingNew": st.integers(),
    },
)
bodies = st.fixed_dictionaries(
    {"Records": st.lists(records, max_size=5)},
    optional={
        "NextShardIterator": st.one_of(st.text(min_size=1, max_size=30), st.none()),
        "MillisBehindLatest": st.integers(0, 10**9),
        "ChildShards": st.lists(
            st.fixed_dictionaries(
                {
                    "ShardId": st.text(min_size=1, max_size=20),
                    "ParentShards": st.lists(st.text(min_size=1, max_size=20), max_size=2),
                    "HashKeyRange": st.fixed_dictionaries({"StartingHashKey": digits, "EndingHashKey": digits}),
                }
            ),
            max_size=2,
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_a_get_records_response_decodes_to_what_botocore_returns(body):
    expected, fast = parsed_by_both(json.dumps(body).encode())
    # Arrival times are the same instants (datetimes compare by instant); the fast path gives them in UTC.
    assert fast == expected
    assert isinstance(fast["Records"], KinesisRecordColumns)  # not the fallback: ChildShards included
    assert all(
        str(record["ApproximateArrivalTimestamp"].tzinfo) == "UTC"
        for record in fast["Records"]
        if "ApproximateArrivalTimestamp" in record
    )


@pytest.mark.parametrize(
    ("status", "body"),
    [
        pytest.param(
            400,
            b'{"__type":"ProvisionedThroughputExceededException","message":"Rate exceeded for shard"}',
            id="throttled",
        ),
        pytest.param(400, b'{"__type":"ExpiredIteratorException","message":"Iterator expired"}', id="expired"),
        pytest.param(500, b"<html>Service Unavailable</html>", id="generic-5xx"),
    ],
)
def test_errors_are_parsed_by_botocore(status, body):
    expected, fast = parsed_by_both(body, status)
    assert fast == expected and fast["Error"]["Code"]


@pytest.mark.parametrize(
    ("operation", "body"),
    [
        pytest.param("ListShards", {"Shards": [{"ShardId": "shardId-0", "SequenceNumberRange": {}}]}, id="list-shards"),
        pytest.param("GetShardIterator", {"ShardIterator": "AAA"}, id="get-shard-iterator"),
    ],
)
def test_other_responses_are_parsed_by_botocore(operation, body):
    expected, fast = parsed_by_both(json.dumps(body).encode(), operation=MODEL.operation_model(operation))
    assert fast == expected


def test_the_fast_path_takes_only_kinesis_get_records():
    # DynamoDB Streams has a GetRecordsOutput too, whose records are not Kinesis records.
    streams = botocore.session.get_session().get_service_model("dynamodbstreams")
    body = {"Records": [{"eventID": "1", "eventName": "INSERT", "dynamodb": {"SequenceNumber": "7", "SizeBytes": 3}}]}
    expected, fast = parsed_by_both(json.dumps(body).encode(), operation=streams.operation_model("GetRecords"))
    assert fast == expected and fast["Records"][0]["dynamodb"]["SizeBytes"] == 3


# --- the columnar path: from the body to user records ------------------------------------------------

user_record = st.tuples(st.text(min_size=1, max_size=8), st.binary(max_size=40))
kinesis_entries = st.lists(
    st.one_of(
        st.binary(max_size=64).map(lambda data: ("plain", data)),
        st.lists(user_record, min_size=1, max_size=4).map(lambda records: ("aggregate", records)),
    ),
    min_size=1,
    max_size=6,
)


def body_of(entries: list[tuple[str, Any]], arrival: float) -> bytes:
    records = []
    for index, (kind, value) in enumerate(entries):
        key, data = ("plain-key", value) if kind == "plain" else aggregate(value)[0::2]
        records.append(
            {
                "SequenceNumber": str(49650000000000000000000000000000000000000000000000000000 + index),
                "ApproximateArrivalTimestamp": arrival + index / 1000,
                "Data": base64.b64encode(data).decode(),
                "PartitionKey": key,
            }
        )
    return json.dumps({"Records": records, "NextShardIterator": "AAA", "MillisBehindLatest": 0}).encode()


@settings(max_examples=200, deadline=None)
@given(kinesis_entries, st.floats(0, 4_000_000_000, allow_nan=False))
def test_the_columns_split_into_the_user_records_botocores_records_make(entries, arrival):
    expected, fast = parsed_by_both(body_of(entries, arrival))
    assert isinstance(fast["Records"], KinesisRecordColumns)
    from_columns = list(user_record_columns(fast["Records"]))
    assert from_columns == user_records(expected["Records"])
    # Positions, data and keys as aws_kinesis_agg's own deaggregator gives them (it hands sub-records over base64).
    reference = [entry["kinesis"] for entry in iter_deaggregate_records(expected["Records"], "Boto3")]
    assert [
        (record.sequence_number, record.sub_sequence_number, record.partition_key, record.data)
        for record in from_columns
    ] == [
        (
            entry["sequenceNumber"],
            entry.get("subSequenceNumber", 0),
            entry["partitionKey"],
            base64.b64decode(entry["data"]) if entry.get("aggregated") else entry["data"],
        )
        for entry in reference
    ]


def test_a_body_msgspec_does_not_take_is_decoded_record_by_record():
    body = {"Records": [{"SequenceNumber": "1", "Data": "YQ==", "ApproximateArrivalTimestamp": "2024-05-01T12:00:00Z"}]}
    expected, fast = parsed_by_both(json.dumps(body).encode())
    assert fast == expected and fast["Records"][0]["Data"] == b"a"


# --- enhanced fan-out: SubscribeToShard's events carry the same records ---------------------------------

EVENT_STREAM = MODEL.operation_model("SubscribeToShard").output_shape.members["EventStream"]
events = st.fixed_dictionaries(
    {"Records": st.lists(records, max_size=5), "MillisBehindLatest": st.integers(0, 10**9)},
    optional={
        "ContinuationSequenceNumber": st.one_of(digits, st.none()),
        "ChildShards": bodies.map(lambda body: body.get("ChildShards", [])),
    },
)


def event_parsed_by_both(payload: bytes, event_type: str = "SubscribeToShardEvent") -> tuple[Any, Any]:
    """(botocore's parse, the fast session's parse) of one event of a SubscribeToShard stream."""
    headers = {":event-type": event_type, ":message-type": "event", ":content-type": "application/json"}
    response = {"status_code": 200, "headers": headers, "body": payload}
    stock = botocore.parsers.create_parser("json")._event_stream_parser
    fast = aws.FastGetRecordsParsers().create_parser("json")._event_stream_parser
    return stock.parse(dict(response), EVENT_STREAM), fast.parse(dict(response), EVENT_STREAM)


@settings(max_examples=200, deadline=None)
@given(events)
def test_a_subscribe_to_shard_event_decodes_to_what_botocore_returns(event):
    expected, fast = event_parsed_by_both(json.dumps(event).encode())
    assert fast == expected
    assert isinstance(fast["SubscribeToShardEvent"]["Records"], KinesisRecordColumns)  # not the fallback


@settings(max_examples=100, deadline=None)
@given(kinesis_entries, st.floats(0, 4_000_000_000, allow_nan=False))
def test_an_event_s_columns_split_into_the_user_records_botocores_records_make(entries, arrival):
    body = json.loads(body_of(entries, arrival))
    payload = {"Records": body["Records"], "ContinuationSequenceNumber": "7", "MillisBehindLatest": 0}
    expected, fast = event_parsed_by_both(json.dumps(payload).encode())
    assert list(user_record_columns(fast["SubscribeToShardEvent"]["Records"])) == user_records(
        expected["SubscribeToShardEvent"]["Records"]
    )


def test_an_event_msgspec_does_not_take_and_other_events_are_botocores():
    odd = {"Records": [{"SequenceNumber": "1", "Data": "YQ==", "ApproximateArrivalTimestamp": "2024-05-01T12:00:00Z"}]}
    expected, fast = event_parsed_by_both(json.dumps({**odd, "MillisBehindLatest": 3}).encode())
    assert fast == expected and fast["SubscribeToShardEvent"]["Records"][0]["Data"] == b"a"
    expected, fast = event_parsed_by_both(b"{}", event_type="initial-response")
    assert fast == expected
