"""The built-in json decoder: a batch's payloads parsed at once into typed columns, bad records set aside."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.json as pa_json
import pytest

from lease_core.errors import ConfigurationError
from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decode import load_decoder
from spark_jobs.decoders.json_objects import JsonDecoder, json_schema_to_arrow, read_json_lines, read_payloads
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


ODD_SCHEMA = pa.schema(
    [
        ("count", pa.int32()),
        ("price", pa.decimal128(5, 2)),
        ("at", pa.timestamp("us", tz="UTC")),
        ("box", pa.struct([pa.field("size", pa.int64(), nullable=False)])),
    ]
)


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b'{"count": 99999999999, "box": {"size": 0}}', "Failed to convert JSON to int32, couldn't parse:99999999999"),
        (
            b'{"price": 123456.789, "box": {"size": 0}}',
            "Failed to convert JSON to decimal128(5, 2): 123456.789 requires precision 9",
        ),
        (
            b'{"at": "yesterday", "box": {"size": 0}}',
            "Failed to convert JSON to timestamp[us, tz=UTC], couldn't parse:yesterday",
        ),
        (b'{"count": 9, "box": {}}', "a required field was absent"),
    ],
    ids=["an int32 overflow", "a decimal too wide", "a timestamp that is none", "a nested required field absent"],
)
def test_a_value_the_reader_refuses_without_naming_a_row_rejects_its_record_not_the_batch(payload, complaint):
    decoded = JsonDecoder(ODD_SCHEMA).decode_batch(
        records(b'{"count": 1, "box": {"size": 1}}', payload, b'{"count": 2, "box": {"size": 2}}'),
        "orders",
        "shardId-0",
    )
    assert decoded.table.column("count").to_pylist() == [1, 2]
    [rejected] = decoded.rejected
    assert rejected.record.sequence_number == "101"
    assert rejected.error == f"the payload of record 101/0 of orders/shardId-0 {complaint}"


@pytest.mark.parametrize("bad_every", [1024, 16, 2], ids=["one bad", "one in 16 bad", "every other bad"])
def test_bad_payloads_cost_a_few_reads_of_each_payload_not_a_read_of_the_whole_batch_each(bad_every):
    """1,024 payloads, k of them not JSON: reading the batch again after each bad payload would hand the
    reader about k x 1,024 payloads (33,000 for one in 16); windows hand it at most 3 x 1,024 + 33k."""
    payloads = [b"{oops" if n % bad_every == 0 else order(id=n) for n in range(1024)]
    bad = range(0, 1024, bad_every)
    parsed: list[int] = []

    def counting(part: list[bytes], parse: pa_json.ParseOptions) -> pa.Table:
        parsed.append(len(part))
        return read_payloads(part, parse)

    lines = read_json_lines(payloads, pa_json.ParseOptions(), "json", read=counting)

    assert sorted(lines.rejected) == list(bad)
    assert lines.rows == [n for n in range(1024) if n % bad_every]
    assert lines.table.column("id").to_pylist() == lines.rows
    assert sum(parsed) <= 3 * 1024 + 33 * len(bad), parsed


def test_a_field_named_like_a_position_column_rejects_its_record_naming_the_field_without_a_schema():
    decoded = JsonDecoder().decode_batch(
        records(order(id=1), order(id=2, sequence_number="mine"), order(id=3, shard_id=None)), "orders", "shardId-0"
    )
    assert decoded.table.column_names == [
        "sequence_number",
        "sub_sequence_number",
        "partition_key",
        "approximate_arrival_timestamp",
        "id",
    ]
    assert decoded.table.column("sequence_number").to_pylist() == ["100", "102"]
    [rejected] = decoded.rejected
    assert rejected.error == (
        "the payload of record 101/0 of orders/shardId-0 has a field named 'sequence_number', "
        "which the batch has as a column already"
    )


def test_which_of_conflicting_records_is_rejected_follows_their_order_in_the_batch_and_a_redo_rejects_the_same():
    batch = records(
        order(id=1), b"{oops", order(id="x"), order(id=2), b"[]", order(id="y"), order(id=3), order(id={"z": 1})
    )
    first, redo = (JsonDecoder().decode_batch(batch, "orders", "shardId-0") for _ in range(2))
    rejected = [(rejected.record.sequence_number, rejected.error) for rejected in first.rejected]
    assert [sequence for sequence, _ in rejected] == ["101", "102", "104", "105", "107"]
    assert "Column(/id) changed from number to string" in rejected[1][1]
    assert first.table.column("id").to_pylist() == [1.0, 2.0, 3.0]
    assert rejected == [(rejected.record.sequence_number, rejected.error) for rejected in redo.rejected]
    assert first.table.equals(redo.table)


@pytest.mark.parametrize(
    ("batches", "types"),
    [
        ([[order(n=1)], [order(n=1.5)]], [("n", pa.float64()), ("n", pa.float64())]),
        (
            [[order(n=None, m=1)], [order(n="text", m=2)]],
            [("m", pa.float64()), ("n", pa.string()), ("m", pa.float64())],
        ),
        ([[order(day="2026-11-29")], [order(day="tomorrow")]], [("day", pa.string()), ("day", pa.string())]),
        (
            [[order(tags=[], m=1)], [order(tags=["a"], m=1)]],
            [("m", pa.float64()), ("tags", pa.list_(pa.string())), ("m", pa.float64())],
        ),
        (
            [[order(item={"id": 1, "note": None})], [order(item={"id": 2.5, "note": None})]],
            [("item", pa.struct([("id", pa.float64())]))] * 2,
        ),
    ],
    ids=[
        "an integer then a fraction",
        "null then a string",
        "a date then text",
        "an empty list then strings",
        "nested",
    ],
)
def test_a_fields_inferred_type_does_not_depend_on_which_values_a_batch_has(batches, types):
    decoder = JsonDecoder()
    landed = [
        (field.name, field.type)
        for payloads in batches
        for field in decoder.decode_batch(records(*payloads), "orders", "shardId-0").table.schema
        if field.name
        not in {"sequence_number", "sub_sequence_number", "partition_key", "approximate_arrival_timestamp"}
    ]
    assert landed == types


def test_an_integer_a_float64_holds_only_rounded_rejects_its_record_without_a_schema():
    decoded = JsonDecoder().decode_batch(records(order(n=2**53), order(n=2**53 + 1), order(n=-3)), "orders", "s-0")
    assert decoded.table.column("n").to_pylist() == [2.0**53, -3.0]
    [rejected] = decoded.rejected
    assert rejected.error.endswith(
        "has an integer in field 'n' beyond 2**53, which its float64 column holds only rounded"
    )
