"""The built-in dynamodb decoder: Kinesis Data Streams for DynamoDB change records as typed columns."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import load_decoder
from tests.support.dynamodb_changes import change_record

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
KEY = {"order_id": {"S": "o-1"}}


def decoded(*payloads: bytes):
    decoder = load_decoder("dynamodb")
    assert decoder is not None
    records = [KinesisRecord(str(100 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]
    return decoder.decode_batch(records, "orders-cdc", "shardId-0")


def test_inserts_modifies_and_removes_are_rows_with_their_keys_and_images_in_dynamodb_json():
    batch = decoded(
        change_record("INSERT", KEY, new_image={**KEY, "price": {"N": "9.5"}}),
        change_record("MODIFY", KEY, new_image={**KEY, "price": {"N": "12"}}, old_image={**KEY, "price": {"N": "9.5"}}),
        change_record("REMOVE", KEY, old_image={**KEY, "price": {"N": "12"}}, ttl_deletion=True),
    )
    assert batch.rejected == ()
    table = batch.table
    assert table.column("event_name").to_pylist() == ["INSERT", "MODIFY", "REMOVE"]
    assert table.schema == load_decoder("dynamodb").columns()
    assert [json.loads(keys) for keys in table.column("keys").to_pylist()] == [{"order_id": {"S": "o-1"}}] * 3
    images = [
        [text and json.loads(text)["price"]["N"] for text in table.column(name).to_pylist()]
        for name in ("new_image", "old_image")
    ]
    assert images == [["9.5", "12", None], [None, "9.5", "12"]]
    assert table.column("user_identity_type").to_pylist() == [None, None, "Service"]
    assert table.column("table_name").to_pylist() == ["Orders"] * 3
    assert table.column("approximate_creation_time")[0].as_py() == datetime(2025, 11, 29, 1, 0, 0, 123000, tzinfo=UTC)
    assert table.schema.field("size_bytes").type == pa.int64()


@pytest.mark.parametrize(
    ("precision", "created", "microsecond"),
    [
        (None, 1764378000123, 123000),
        ("MILLISECOND", 1764378000123, 123000),
        ("MICROSECOND", 1764378000123456, 123456),
    ],
    ids=["absent: milliseconds, as before the option existed", "milliseconds", "microseconds"],
)
def test_the_creation_time_is_read_in_the_precision_the_record_names_milliseconds_when_it_names_none(
    precision, created, microsecond
):
    record = json.loads(change_record("INSERT", KEY, new_image=KEY, created_millis=created))
    if precision is not None:
        record["dynamodb"]["ApproximateCreationDateTimePrecision"] = precision
    batch = decoded(json.dumps(record).encode())
    assert batch.rejected == ()
    assert batch.table.column("approximate_creation_time").to_pylist() == [
        datetime(2025, 11, 29, 1, 0, 0, microsecond, tzinfo=UTC)
    ]


def test_records_that_are_not_dynamodb_changes_are_rejected_with_the_reason():
    other_source = json.loads(change_record("INSERT", KEY, new_image=KEY))
    other_source["eventSource"] = "aws:s3"
    batch = decoded(
        b"not json",
        json.dumps(other_source).encode(),
        change_record("UPSERT", KEY, new_image=KEY),
        change_record("INSERT", KEY, new_image=KEY),
    )
    assert batch.table.column("sequence_number").to_pylist() == ["103"]
    reasons = [rejected.error for rejected in batch.rejected]
    assert "record 100/0 of orders-cdc/shardId-0" in reasons[0] and "Invalid value" in reasons[0]
    assert reasons[1].endswith("has eventSource 'aws:s3', not 'aws:dynamodb'")
    assert reasons[2].endswith("has eventName 'UPSERT', not one of INSERT, MODIFY, REMOVE")
