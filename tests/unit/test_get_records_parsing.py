"""The fast GetRecords decoding of lease_core's clients returns exactly what botocore's own parser returns,
on any body Kinesis could send, and leaves errors and every other response to botocore; its columns
split into the user records botocore's records make (KPL aggregates included), and KPL aggregates split
in bulk exactly as they split one by one, well-formed or not."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import Any
from unittest.mock import patch

import botocore.parsers
import botocore.session
import pytest
from aws_kinesis_agg import MAGIC as KPL_MAGIC
from aws_kinesis_agg.deaggregator import iter_deaggregate_records
from aws_kinesis_agg.deaggregator import messages_pb2 as reference_messages
from google.protobuf import descriptor_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from lease_core import aws
from lease_core.model.kinesis_record_columns import KinesisRecordColumns
from lease_core.retrieval import kpl_deaggregation, kpl_messages
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


# --- KPL aggregates split in bulk: exactly as one by one, on any message ------------------------------
# The bulk split (upb reading whole chunks of aggregates at once) is taken only where it is proven to
# read what KPL's schema reads aggregate by aggregate; aggregates written field by field on the wire,
# well-formed or not, must come out the same either way, whatever the chunk size.


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def wire_field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: a varint (int) or length-delimited (bytes) value."""
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


uint64 = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1))
table_string = st.one_of(st.text(max_size=6).map(str.encode), st.binary(max_size=4))  # some are not UTF-8
tag = st.builds(
    lambda key, value: (b"" if key is None else wire_field(1, key)) + (b"" if value is None else wire_field(2, value)),
    st.one_of(st.none(), table_string),
    st.one_of(st.none(), table_string),
)
record_field = st.one_of(
    st.builds(lambda index: wire_field(1, index), uint64),  # partition_key_index
    st.builds(lambda index: wire_field(2, index), uint64),  # explicit_hash_key_index
    st.builds(lambda data: wire_field(3, data), st.binary(max_size=12)),  # data
    st.builds(lambda value: wire_field(4, value), tag),
    st.builds(lambda values: wire_field(1, b"".join(map(varint, values))), st.lists(uint64, max_size=2)),  # packed
    st.builds(wire_field, st.integers(5, 40), st.one_of(uint64, st.binary(max_size=4))),  # unknown to KPL
)
tag_with_key = tag.filter(lambda value: value.startswith(b"\x0a"))


def well_formed_record(hash_key: st.SearchStrategy[int | None]) -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda key, hash_key, data, tags: b"".join(
            [wire_field(1, key), b"" if hash_key is None else wire_field(2, hash_key), wire_field(3, data)]
            + [wire_field(4, value) for value in tags]
        ),
        st.integers(0, 2),
        hash_key,
        st.binary(max_size=12),
        st.lists(tag_with_key, max_size=1),
    )


any_record = st.one_of(
    well_formed_record(st.one_of(st.none(), st.integers(0, 1))), st.lists(record_field, max_size=5).map(b"".join)
)
aggregate_field = st.one_of(
    st.builds(lambda key: wire_field(1, key), table_string),
    st.builds(lambda key: wire_field(2, key), table_string),
    st.builds(lambda record: wire_field(3, record), any_record),
    st.builds(wire_field, st.integers(4, 40), st.one_of(uint64, st.binary(max_size=4))),
)


def aggregate_message(records: st.SearchStrategy[bytes], hash_keys: int = 2) -> st.SearchStrategy[bytes]:
    """A message KPL could write: three partition keys, `hash_keys` explicit hash keys, `records`."""
    return st.builds(
        lambda keys, hash_keys, records: b"".join(
            [*(wire_field(1, key) for key in keys), *(wire_field(2, key) for key in hash_keys)]
            + [wire_field(3, record) for record in records]
        ),
        st.lists(st.sampled_from([b"a", b"bb", "\u00e9".encode()]), min_size=3, max_size=3),
        st.lists(
            st.sampled_from([b"1", b"340282366920938463463374607431768211455"]), min_size=hash_keys, max_size=hash_keys
        ),
        st.lists(records, max_size=4),
    )


# As KPL writes them, what the bulk split takes: an aggregate holds explicit hash keys when every one
# of its user records names one.
uniform_message = st.one_of(
    aggregate_message(well_formed_record(st.none()), hash_keys=0),
    aggregate_message(well_formed_record(st.integers(0, 1))),
)
well_formed_message = aggregate_message(well_formed_record(st.one_of(st.none(), st.integers(0, 1))))
# Nearly well-formed: a required field missing, or a field more (twice, packed, a tag without its key...).
loose_record = st.builds(
    lambda key, hash_key, data, more: b"".join(
        [
            b"" if key is None else wire_field(1, key),
            b"" if hash_key is None else wire_field(2, hash_key),
            b"" if data is None else wire_field(3, data),
            *more,
        ]
    ),
    st.one_of(st.integers(0, 3), st.none()),
    st.one_of(st.none(), st.integers(0, 2)),
    st.one_of(st.binary(max_size=12), st.none()),
    st.lists(record_field, max_size=2),
)
message = st.one_of(
    well_formed_message,
    aggregate_message(loose_record),
    aggregate_message(loose_record, hash_keys=0),
    st.lists(aggregate_field, max_size=6).map(b"".join),
    st.tuples(well_formed_message, st.integers(0, 40)).map(lambda cut: cut[0][: cut[1]]),  # truncated
    st.binary(max_size=30),
)
kpl_record_data = st.one_of(
    message.map(lambda value: KPL_MAGIC + value + hashlib.md5(value).digest()),
    message.map(lambda value: KPL_MAGIC + value + bytes(16)),  # its digest does not match
    st.binary(max_size=20),  # plain
)


def columns_of(data: list[bytes]) -> KinesisRecordColumns:
    return KinesisRecordColumns.of(
        [
            {
                "SequenceNumber": str(49650000000000000000000000000000000000000000000000000000 + index),
                "ApproximateArrivalTimestamp": datetime(2024, 5, 1, tzinfo=UTC),
                "Data": value,
                "PartitionKey": "plain-key",
            }
            for index, value in enumerate(data)
        ]
    )


@settings(max_examples=500, deadline=None)
@given(st.lists(kpl_record_data, min_size=1, max_size=8), st.integers(1, 120))
def test_aggregates_split_in_bulk_as_one_by_one_on_any_message(data, chunk_bytes):
    records = columns_of(data)
    with patch.object(kpl_deaggregation, "_CHUNK_BYTES", chunk_bytes):
        in_bulk = list(user_record_columns(records))
        with patch.object(kpl_deaggregation, "_split_in_bulk", return_value=None):
            one_by_one = list(user_record_columns(records))
    assert in_bulk == one_by_one


@settings(max_examples=200, deadline=None)
@given(st.lists(uniform_message, min_size=1, max_size=6))
def test_well_formed_aggregates_are_split_in_bulk(messages):
    data = [KPL_MAGIC + value + hashlib.md5(value).digest() for value in messages]
    with patch.object(kpl_deaggregation, "_split_one_by_one", side_effect=AssertionError("read one by one")):
        in_bulk = list(user_record_columns(columns_of(data)))
    assert in_bulk == user_records(columns_of(data))


def test_kpl_messages_reads_kpls_schema_field_for_field():
    def fields(message: Any) -> list[tuple[str, int, int, int]]:
        described = descriptor_pb2.DescriptorProto()
        message.DESCRIPTOR.CopyToProto(described)
        return [(field.name, field.number, field.label, field.type) for field in described.field]

    assert [fields(kpl_messages.AggregatedRecord), fields(kpl_messages.AggregatedRecord().records.add())] == [
        fields(reference_messages.AggregatedRecord),
        fields(reference_messages.Record),
    ]
    assert fields(kpl_messages.AggregatedRecord().records.add().tags.add()) == fields(reference_messages.Tag)


def record_bytes(*fields: bytes) -> bytes:
    return wire_field(3, b"".join(fields))


KEYS = wire_field(1, b"a") + wire_field(1, b"b")
HASH_KEYS = wire_field(2, b"1") + wire_field(2, b"2")
GOOD = record_bytes(wire_field(1, 0), wire_field(3, b"x"))
GOOD_WITH_HASH_KEY = record_bytes(wire_field(1, 1), wire_field(2, 1), wire_field(3, b"y"))


@pytest.mark.parametrize(
    ("message", "user_records_of_it"),
    [
        pytest.param(KEYS + GOOD + GOOD, 2, id="well-formed"),
        pytest.param(KEYS, 0, id="no-user-records"),
        pytest.param(KEYS + HASH_KEYS + GOOD_WITH_HASH_KEY + GOOD_WITH_HASH_KEY, 2, id="explicit-hash-keys"),
        pytest.param(KEYS + HASH_KEYS + GOOD_WITH_HASH_KEY + GOOD, 2, id="some-user-records-with-hash-keys"),
        pytest.param(
            KEYS
            + HASH_KEYS
            + GOOD
            + record_bytes(wire_field(1, 0), wire_field(2, 0), wire_field(2, 1), wire_field(3, b"z")),
            2,
            id="hash-key-twice-in-one-none-in-another",
        ),
        pytest.param(
            KEYS + GOOD + record_bytes(wire_field(1, 0), wire_field(1, 1), wire_field(3, b"z")),
            2,
            id="a-key-index-twice",
        ),
        pytest.param(
            KEYS
            + record_bytes(wire_field(3, b"x"))
            + record_bytes(wire_field(1, 0), wire_field(1, 1), wire_field(3, b"z")),
            1,
            id="key-index-missing-in-one-twice-in-another",
        ),
        pytest.param(KEYS + record_bytes(wire_field(1, b"\x01"), wire_field(3, b"x")), 1, id="packed-key-index"),
        pytest.param(
            KEYS + record_bytes(wire_field(1, 0), wire_field(3, b"x"), wire_field(4, wire_field(2, b"v"))),
            1,
            id="tag-without-key",
        ),
        pytest.param(
            KEYS + record_bytes(wire_field(1, 0), wire_field(3, b"x"), wire_field(4, wire_field(1, b"k"))), 1, id="tag"
        ),
        pytest.param(
            KEYS
            + GOOD
            + wire_field(9, b"later")
            + record_bytes(wire_field(1, 0), wire_field(3, b"x"), wire_field(12, 7)),
            2,
            id="unknown-fields",
        ),
        pytest.param(KEYS + record_bytes(wire_field(1, 2), wire_field(3, b"x")), 1, id="key-index-past-its-table"),
        pytest.param(
            KEYS + record_bytes(wire_field(1, 0), wire_field(2, 0), wire_field(3, b"x")),
            1,
            id="hash-key-index-without-a-table",
        ),
        pytest.param(wire_field(1, b"\xff") + GOOD, 1, id="a-key-that-is-not-utf-8"),
        pytest.param((KEYS + GOOD)[:-1], 1, id="truncated"),
    ],
)
def test_aggregates_split_in_bulk_as_one_by_one(message, user_records_of_it):
    # Beside a well-formed aggregate in the same chunk, whose user records must not be lost either way.
    data = [KPL_MAGIC + value + hashlib.md5(value).digest() for value in (KEYS + GOOD, message, KEYS + GOOD)]
    in_bulk = list(user_record_columns(columns_of(data)))
    with patch.object(kpl_deaggregation, "_split_in_bulk", return_value=None):
        assert in_bulk == list(user_record_columns(columns_of(data)))
    assert len(in_bulk) == 1 + user_records_of_it + 1


def test_a_key_that_is_not_utf_8_is_read_with_replacement_characters_as_kcl_reads_it():
    message = wire_field(1, b"k\xff") + GOOD
    (record,) = user_record_columns(columns_of([KPL_MAGIC + message + hashlib.md5(message).digest()]))
    assert (record.partition_key, record.data) == ("k\ufffd", b"x")


def test_an_aggregate_taken_as_a_plain_record_is_logged_with_the_splitting_lock_free():
    """A producer's malformed aggregates (a valid digest over a message that does not decode) are split
    one by one and logged after the process-wide lock on splits is let go: a slow log stalls no other
    lease's split."""
    locked_while_logging: list[bool] = []

    class LockWitness(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            locked_while_logging.append(kpl_deaggregation._SPLITTING.locked())

    message = (KEYS + GOOD)[:-1]  # truncated
    data = [KPL_MAGIC + value + hashlib.md5(value).digest() for value in (KEYS + GOOD, message)]
    witness = LockWitness(logging.WARNING)
    kpl_deaggregation.log.addHandler(witness)
    try:
        records = list(user_record_columns(columns_of(data)))
    finally:
        kpl_deaggregation.log.removeHandler(witness)
    assert len(records) == 2  # the well-formed aggregate's user record, and the malformed one as a record
    assert locked_while_logging == [False]
