"""The built-in json decoder: a batch's payloads parsed at once into typed columns, bad records set aside."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lease_core.errors import ConfigurationError
from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import load_decoder
from spark_jobs.decoders.json_objects import JsonDecoder, json_schema_to_arrow
from spark_jobs.errors import FunctionLoadError
from spark_jobs.record_processing import RecordProcessing

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": ["number", "null"]},
        "placed_at": {"type": "string", "format": "date-time"},
        "customer": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        },
    },
    "required": ["order_id"],
}


def records(*payloads: bytes) -> list[KinesisRecord]:
    return [KinesisRecord(str(100 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]


def order(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_json_schema_document_gives_typed_columns_nested_objects_as_structs_and_required_fields_not_null():
    schema = json_schema_to_arrow(ORDER_SCHEMA)
    assert schema == pa.schema(
        [
            pa.field("order_id", pa.string(), nullable=False),
            pa.field("amount", pa.float64()),
            pa.field("placed_at", pa.timestamp("us", tz="UTC")),
            pa.field("customer", pa.struct([("id", pa.int64()), ("tags", pa.list_(pa.string()))])),
        ]
    )


def test_a_date_string_stays_a_string_as_arrows_reader_would_take_a_date_column_from_numbers_only():
    schema = {"type": "object", "properties": {"due": {"type": "string", "format": "date"}}}
    decoded = JsonDecoder.from_options({"schema": schema}).decode_batch(
        records(b'{"due": "2026-11-29"}'), "orders", "shardId-0"
    )
    assert decoded.rejected == ()
    assert decoded.table.column("due").type == pa.string()
    assert decoded.table.column("due").to_pylist() == ["2026-11-29"]


def test_records_decoded_with_a_schema_have_its_columns_after_the_positions_and_ignore_other_fields():
    decoder = JsonDecoder.from_options({"schema": ORDER_SCHEMA})
    batch = records(
        order(order_id="a", amount=3, placed_at="2026-11-29T01:00:00Z", customer={"id": 7, "tags": ["vip"]}, extra=1),
        b'{\n  "order_id": "b"\n}',  # pretty-printed: line breaks inside one payload
    )
    decoded = decoder.decode_batch(batch, "orders", "shardId-0")
    assert decoded.rejected == ()
    assert decoded.table.schema == decoder.columns()
    assert decoded.table.column("sequence_number").to_pylist() == ["100", "101"]
    assert decoded.table.select(["order_id", "amount", "customer"]).to_pylist() == [
        {"order_id": "a", "amount": 3.0, "customer": {"id": 7, "tags": ["vip"]}},
        {"order_id": "b", "amount": None, "customer": None},
    ]
    assert decoded.table.column("placed_at")[0].as_py() == datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def test_records_that_do_not_fit_the_schema_are_rejected_in_order_naming_the_record_and_why():
    decoder = JsonDecoder.from_options({"schema": ORDER_SCHEMA})
    batch = records(
        order(order_id="a"), order(order_id="b", amount="lots"), b"not json", order(amount=1), b"  ", b"[1]"
    )
    decoded = decoder.decode_batch(batch, "orders", "shardId-0")
    assert decoded.table.column("order_id").to_pylist() == ["a"]
    reasons = [(rejected.record.sequence_number, rejected.error) for rejected in decoded.rejected]
    assert [sequence for sequence, _ in reasons] == ["101", "102", "103", "104", "105"]
    assert "record 101/0 of orders/shardId-0" in reasons[0][1] and "amount" in reasons[0][1]
    assert "Invalid value" in reasons[1][1]
    assert reasons[2][1].endswith("misses the required field 'order_id'")
    assert reasons[3][1].endswith("is empty, not a JSON object")
    assert "changed from object to array" in reasons[4][1]


def test_inferred_columns_follow_the_records_and_a_type_conflict_rejects_the_later_record_naming_the_field():
    decoder = load_decoder("json")
    assert decoder is not None and decoder.columns() is None
    first = decoder.decode_batch(records(order(id=1, item={"sku": "x"})), "orders", "shardId-0")
    later = decoder.decode_batch(
        records(order(id=2, note="new"), order(id="three"), order(id=4)), "orders", "shardId-0"
    )
    assert first.table.column_names[-2:] == ["id", "item"] and first.table.schema.field("item").type == pa.struct(
        [("sku", pa.string())]
    )
    assert later.table.select(["id", "note"]).to_pylist() == [{"id": 2, "note": "new"}, {"id": 4, "note": None}]
    [conflict] = later.rejected
    assert conflict.record.sequence_number == "101" and "Column(/id) changed from number to string" in conflict.error


def test_a_batch_of_only_bad_records_decodes_to_no_rows():
    decoded = JsonDecoder().decode_batch(records(b"{", b""), "orders", "shardId-0")
    assert decoded.table.num_rows == 0 and len(decoded.rejected) == 2


def test_a_pyarrow_schema_travels_in_the_rounds_options_and_comes_back_the_same():
    schema = pa.schema([("order_id", pa.string()), ("amount", pa.decimal128(10, 2))])
    processing = RecordProcessing.from_options({"decode": "json", "decode_options": {"schema": schema}})
    carried = RecordProcessing.from_options(json.loads(json.dumps(processing.to_dict())))
    decoder = load_decoder(carried.decode, carried.decode_options)
    assert isinstance(decoder, JsonDecoder) and decoder.schema == schema


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"schema": {"type": "object", "properties": {"when": {"type": "time"}}}}, "schema.when has type 'time'"),
        ({"schema": {"type": "array", "items": {"type": "string"}}}, "schema must describe an object"),
        ({"schema": 3}, "schema must be a JSON Schema document or a pyarrow.Schema, got 3"),
        ({"schema": {"type": "object", "properties": {"sequence_number": {"type": "string"}}}}, "'sequence_number'"),
        ({"schema_file": "x"}, "the json decoder has no option 'schema_file'"),
    ],
    ids=["a type JSON has not", "not an object", "not a schema", "a column the batch has", "an unknown option"],
)
def test_wrong_options_of_the_json_decoder_are_refused_naming_the_option(options, complaint):
    with pytest.raises(ConfigurationError, match=complaint) as raised:
        RecordProcessing.from_options({"decode": "json", "decode_options": options})
    assert raised.value.key == "decode_options"
    with pytest.raises(FunctionLoadError, match=complaint):
        load_decoder("json", options)


def test_options_for_a_users_decoder_are_refused():
    with pytest.raises(ConfigurationError, match=r"are for a built-in decoder, not .users\.orders:decode."):
        RecordProcessing.from_options({"decode": "users.orders:decode", "decode_options": {"schema": {}}})
