"""The built-in avro decoder: Avro types as Arrow columns, a batch decoded in one pass, bad payloads set aside."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import fastavro
import pyarrow as pa
import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord, UserRecords
from spark_jobs.decode import load_decoder
from spark_jobs.decoders.avro_records import AvroDecoder, avro_schema, read_avro
from spark_jobs.errors import FunctionLoadError, TransformError
from spark_jobs.record_processing import RecordProcessing
from tests.support.avro_payloads import avro_datum

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
EVERY_TYPE = {
    "type": "record",
    "name": "Everything",
    "fields": [
        {"name": "flag", "type": "boolean"},
        {"name": "small", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "raw", "type": "bytes"},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 4}},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "BLUE"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {
            "name": "address",
            "type": {"type": "record", "name": "Address", "fields": [{"name": "city", "type": "string"}]},
        },
        {"name": "previous", "type": ["null", "Address"], "default": None},
    ],
}
EVERY_VALUE = {
    "flag": True,
    "small": 7,
    "ratio": 0.5,
    "raw": b"\x00\x01",
    "hash": b"abcd",
    "colour": "BLUE",
    "tags": ["a", "b"],
    "counts": {"x": 1},
    "at": datetime(2026, 11, 29, 1, 2, 3, 4000, tzinfo=UTC),
    "at_us": datetime(2026, 11, 29, 1, 2, 3, 4005, tzinfo=UTC),
    "day": date(2026, 11, 29),
    "clock": time(1, 2, 3, 4000),
    "price": Decimal("12.34"),
    "id": UUID("12345678-1234-5678-1234-567812345678"),
    "address": {"city": "Porto"},
    "previous": None,
}


def records(*payloads: bytes) -> list[KinesisRecord]:
    return [KinesisRecord(str(100 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]


def order(n: int) -> bytes:
    return avro_datum(ORDER, {"order_id": f"o-{n}", "amount": n * 1.5, "note": None if n % 2 else f"note {n}"})


def test_avro_types_map_to_arrow_types_with_logical_types_as_arrows_own():
    assert avro_schema(EVERY_TYPE).arrow == pa.schema(
        [
            ("flag", pa.bool_()),
            ("small", pa.int32()),
            ("ratio", pa.float32()),
            ("raw", pa.binary()),
            ("hash", pa.binary()),
            ("colour", pa.string()),
            ("tags", pa.list_(pa.string())),
            ("counts", pa.map_(pa.string(), pa.int64())),
            ("at", pa.timestamp("ms", tz="UTC")),
            ("at_us", pa.timestamp("us", tz="UTC")),
            ("day", pa.date32()),
            ("clock", pa.time32("ms")),
            ("price", pa.decimal128(9, 2)),
            ("id", pa.string()),
            ("address", pa.struct([("city", pa.string())])),
            ("previous", pa.struct([("city", pa.string())])),
        ]
    )


def test_every_type_decodes_to_the_value_it_was_written_with():
    decoded = AvroDecoder.from_options({"schema": EVERY_TYPE}).decode_batch(
        records(avro_datum(EVERY_TYPE, EVERY_VALUE)), "orders", "shardId-0"
    )
    assert decoded.rejected == ()
    row = decoded.table.to_pylist()[0]
    expected = {**EVERY_VALUE, "id": str(EVERY_VALUE["id"]), "counts": [("x", 1)]}
    assert {name: row[name] for name in expected} == expected


def test_a_batch_gives_each_record_its_row_after_its_position_columns():
    decoder = load_decoder("avro", {"schema": json.dumps(ORDER)})
    assert decoder is not None
    decoded = decoder.decode_batch(records(*[order(n) for n in range(5)]), "orders", "shardId-0")
    assert decoded.rejected == ()
    assert decoded.table.schema == decoder.columns()
    assert decoded.table.column("sequence_number").to_pylist() == [str(100 + n) for n in range(5)]
    assert decoded.table.column("order_id").to_pylist() == [f"o-{n}" for n in range(5)]
    assert decoded.table.column("note").to_pylist() == ["note 0", None, "note 2", None, "note 4"]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(b"", "EOFError", id="empty"),
        pytest.param(order(1)[:-2], "EOFError", id="cut short"),
        pytest.param(order(1) + b"\x00\x00", "it does not end where the payload does", id="bytes after the datum"),
        pytest.param(b"\x04\xff\xfe" + order(1)[3:], "UnicodeDecodeError", id="not utf-8 where a string is"),
    ],
)
def test_a_payload_that_is_not_a_datum_is_rejected_with_the_reason_and_the_others_decode(payload, reason):
    batch = records(order(0), payload, order(2), order(3))
    decoded = AvroDecoder.from_options({"schema": ORDER}).decode_batch(batch, "orders", "shardId-0")
    assert decoded.table.column("order_id").to_pylist() == ["o-0", "o-2", "o-3"]
    assert [rejected.record.sequence_number for rejected in decoded.rejected] == ["101"]
    error = decoded.rejected[0].error
    assert error.startswith("the payload of record 101/0 of orders/shardId-0 is not a datum of its Avro schema")
    assert reason in error


def test_bad_payloads_side_by_side_and_at_both_ends_are_each_rejected():
    batch = records(b"\x01", order(1), b"", b"\x03", order(4), order(5)[:-1])
    decoded = AvroDecoder.from_options({"schema": ORDER}).decode_batch(batch, "orders", "shardId-0")
    assert decoded.table.column("order_id").to_pylist() == ["o-1", "o-4"]
    assert [rejected.record.sequence_number for rejected in decoded.rejected] == ["100", "102", "103", "105"]


def test_the_schema_file_is_read_where_the_job_decodes_and_its_options_name_the_file(tmp_path: Path):
    path = tmp_path / "order.avsc"
    decoder = AvroDecoder.from_options({"schema_file": str(path)})  # not there yet where the pipeline is checked
    path.write_text(json.dumps(ORDER))
    assert decoder.options() == {"schema_file": str(path)}
    assert decoder.decode_batch(records(order(3)), "orders", "shardId-0").table.column("amount").to_pylist() == [4.5]


def test_a_schema_file_that_cannot_be_read_fails_the_batch_naming_the_option(tmp_path: Path):
    decoder = AvroDecoder.from_options({"schema_file": str(tmp_path / "missing.avsc")})
    with pytest.raises(TransformError, match=r"schema_file '.*missing\.avsc' cannot be read"):
        decoder.decode_batch(records(order(1)), "orders", "shardId-0")


def test_the_options_round_trip_through_the_rounds_record_processing():
    processing = RecordProcessing.from_options({"decode": "avro", "decode_options": {"schema": ORDER}})
    again = RecordProcessing.from_options(json.loads(json.dumps(processing.to_dict())))
    assert again == processing
    assert AvroDecoder.from_options(again.decode_options).schema.arrow == avro_schema(ORDER).arrow


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        pytest.param({}, "exactly one of the options schema and schema_file", id="neither"),
        pytest.param({"schema": ORDER, "schema_file": "x"}, "exactly one of", id="both"),
        pytest.param({"schema": ORDER, "codec": "x"}, "has no option 'codec'", id="unknown option"),
        pytest.param({"schema": "{not json"}, "schema must be an Avro schema as JSON text", id="not json"),
        pytest.param({"schema": {"type": "string"}}, "schema must be an Avro record schema", id="not a record"),
        pytest.param({"schema_file": 3}, "schema_file must be the path of a file", id="file not a path"),
        pytest.param(
            {"schema": {**ORDER, "fields": [{"name": "x", "type": ["int", "string"]}]}},
            r"schema.x is a union of \['int', 'string'\]",
            id="a union of two types",
        ),
        pytest.param(
            {"schema": {**ORDER, "fields": [{"name": "x", "type": "Missing"}]}},
            "schema.x refers to the type 'Missing', which the schema does not define",
            id="an unknown named type",
        ),
        pytest.param(
            {"schema": {**ORDER, "fields": [{"name": "next", "type": ["null", "shop.Order"]}]}},
            "schema.next refers to 'shop.Order' inside itself",
            id="a recursive record",
        ),
        pytest.param(
            {"schema": {**ORDER, "fields": [{"name": "d", "type": {"type": "bytes", "logicalType": "decimal"}}]}},
            "schema.d is a decimal without a 'precision'",
            id="a decimal without precision",
        ),
        pytest.param(
            {"schema": {**ORDER, "fields": [{"name": "shard_id", "type": "string"}]}},
            "has a field named 'shard_id', which the batch has as a column already",
            id="a batch column's name",
        ),
    ],
)
def test_options_that_are_wrong_fail_loading_naming_the_option(options, problem):
    with pytest.raises(FunctionLoadError, match=problem):
        load_decoder("avro", options)


def test_a_batch_as_a_slot_hands_it_over_in_columns_decodes_as_the_same_records_one_by_one_do():
    batch = records(order(0), b"\x01", order(2))
    decoder = AvroDecoder.from_options({"schema": ORDER})
    as_columns = decoder.decode_batch(UserRecords.of(batch), "orders", "shardId-0")
    one_by_one = decoder.decode_batch(batch, "orders", "shardId-0")
    assert as_columns.table.equals(one_by_one.table)
    assert [rejected.error for rejected in as_columns.rejected] == [rejected.error for rejected in one_by_one.rejected]


PRICED = {
    "type": "record",
    "name": "Priced",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}},
    ],
}


def priced(n: int, unscaled: int) -> bytes:
    """A datum whose price's bytes hold `unscaled` as they are, however many digits it has."""
    digits = unscaled.to_bytes(4, "big", signed=True)
    return avro_datum(PRICED, {"order_id": f"o-{n}", "price": Decimal(0)})[:-2] + bytes([len(digits) * 2]) + digits


def test_a_value_its_column_cannot_hold_rejects_only_its_record_naming_the_field():
    batch = records(priced(0, 1234), priced(1, 1234567), priced(2, -99))
    decoded = AvroDecoder.from_options({"schema": PRICED}).decode_batch(batch, "orders", "shardId-0")
    assert decoded.table.column("order_id").to_pylist() == ["o-0", "o-2"]
    assert decoded.table.column("price").to_pylist() == [Decimal("12.34"), Decimal("-0.99")]
    assert [rejected.record.sequence_number for rejected in decoded.rejected] == ["101"]
    assert "its field 'price' holds a value its column cannot" in decoded.rejected[0].error


def test_bad_payloads_are_each_read_a_bounded_number_of_times():
    reads = {"block": 0, "datum": 0}

    def read_block(stream: io.BytesIO) -> Iterator[object]:
        reads["block"] += 1
        return iter(fastavro.reader(stream))

    def read_datum(stream: io.BytesIO, schema: object) -> object:
        reads["datum"] += 1
        return fastavro.schemaless_reader(stream, schema)

    payloads = [order(0), *[b"\x01"] * 50, order(51), b"\x03", order(53)]
    read = read_avro(avro_schema(ORDER), payloads, read_block=read_block, read_datum=read_datum)
    assert read.rows == [0, 51, 53]
    assert sorted(read.rejected) == [*range(1, 51), 52]
    assert reads["block"] == 1
    assert reads["datum"] <= len(payloads)


MONEY = {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 2}


def test_a_named_type_with_a_logical_type_can_be_used_again_by_name():
    fields = [{"name": "price", "type": MONEY}, {"name": "tax", "type": "Money"}]
    schema = {"type": "record", "name": "Bill", "fields": fields}
    assert avro_schema(schema).arrow == pa.schema([("price", pa.decimal128(12, 2)), ("tax", pa.decimal128(12, 2))])


def test_a_uuid_on_a_fixed_is_its_16_bytes_whatever_they_are():
    schema = {
        "type": "record",
        "name": "Tagged",
        "fields": [{"name": "id", "type": {"type": "fixed", "name": "Id", "size": 16, "logicalType": "uuid"}}],
    }
    assert avro_schema(schema).arrow == pa.schema([("id", pa.binary())])
    decoded = AvroDecoder.from_options({"schema": schema}).decode_batch(
        records(bytes(range(0x80, 0x90))), "orders", "shardId-0"
    )
    assert decoded.rejected == ()
    assert decoded.table.column("id").to_pylist() == [bytes(range(0x80, 0x90))]


def test_bad_payloads_at_a_windows_edges_are_rejected_and_the_same_batch_gives_the_same_reasons():
    payloads = [order(n) for n in range(2100)]
    for bad in (1023, 1024, 2099):
        payloads[bad] = order(bad)[:-2]
    first, again = (read_avro(avro_schema(ORDER), payloads) for _ in range(2))
    assert sorted(first.rejected) == [1023, 1024, 2099]
    assert first.rows == [n for n in range(2100) if n not in (1023, 1024, 2099)]
    assert first.table.column("order_id").to_pylist() == [f"o-{n}" for n in first.rows]
    assert first.rejected == again.rejected
