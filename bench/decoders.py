"""Benchmark: the built-in decoders' CPU per MiB of payload, against a per-record Python loop.

Method. For each built-in decoder, --records payloads as its producers write them (in this process,
with the tests' record builders): `json`, orders of ~200 bytes with a nested object, decoded with a
JSON Schema; `cloudwatch_logs`, gzip'd subscription envelopes of 1 to 5 log events; `dynamodb`, change
records of Kinesis Data Streams for DynamoDB with new and old images; `avro`, the same orders as Avro
binary datums (a timestamp-millis, a nested record, an optional string); `glue_schema_registry`, those
datums framed by the Glue Schema Registry serializer (half of them zlib'd), their schema version
looked up in the process (no Glue: its lookups are once per process); `protobuf`, the same orders as
Protobuf messages (~80 bytes: a nested message, an enum, a repeated string, a map). They are cut into batches of
--batch records, the size of a slot's batch of small records, each a batch's columns (`UserRecords`) as a
slot hands them to its decoder. Each batch goes through:
1. The decoder: `decode_batch` of the built-in decoder (`spark_jobs.decode.load_decoder`), which
   makes the batch's table (position columns and decoded columns) and the rejected records.
2. The loop: what a user's decoder does for the same rows, written plainly, one record at a time:
   `json.loads` (after `gzip.decompress` for CloudWatch Logs; one row per log event), for Avro
   `fastavro.schemaless_reader` with the parsed schema (after reading the registry's header and
   inflating for the Glue Schema Registry, its schema found in a dict by version id); for Protobuf
   `FromString` then `json_format.MessageToDict` (fields with no presence printed); the row as a
   dict of the same columns, then `pyarrow.Table.from_pylist` with the same schema and the position
   columns (what `spark_jobs.decode.Decoder` does with a user's function).
The two run interleaved --repeats times (after one batch of each, untimed: the libraries' first
imports, pandas' among them, are not decoding) and the least CPU (this process's, `time.process_time`) of
each is kept. MiB/CPU s = payload MiB (as the stream carries it: gzip'd for CloudWatch Logs) / CPU
seconds. Goal: the decoder >= 2x the loop for every decoder.

    .venv/bin/python bench/decoders.py [--records 40000] [--batch 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import time
import zlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import fastavro
import pyarrow as pa
from google.protobuf import json_format

from lease_core.retrieval.kinesis_records import KinesisRecord, UserRecords
from sinks.record_columns import POSITION_COLUMNS, POSITION_SCHEMA
from spark_jobs.decode import RecordDecoder, load_decoder
from spark_jobs.decoders.avro_records import avro_schema
from spark_jobs.decoders.cloudwatch_logs import LOG_EVENT_SCHEMA
from spark_jobs.decoders.dynamodb_changes import CHANGE_SCHEMA
from spark_jobs.decoders.glue_schema_registry import GlueSchemaRegistryDecoder, SchemaVersion
from spark_jobs.decoders.json_objects import json_schema_to_arrow
from spark_jobs.decoders.protobuf_messages import arrow_schema, compile_proto
from tests.support.avro_payloads import VersionTable, avro_datum, gsr_framed
from tests.support.cloudwatch_logs import data_message, log_events
from tests.support.dynamodb_changes import change_record

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "number"},
        "quantity": {"type": "integer"},
        "currency": {"type": "string"},
        "placed_at": {"type": "string", "format": "date-time"},
        "customer": {"type": "object", "properties": {"id": {"type": "integer"}, "country": {"type": "string"}}},
    },
    "required": ["order_id"],
}
ORDER_SCHEMA = json_schema_to_arrow(ORDER)
AVRO_ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "quantity", "type": "int"},
        {"name": "currency", "type": "string"},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [{"name": "id", "type": "long"}, {"name": "country", "type": "string"}],
            },
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
AVRO_ORDER_SCHEMA = avro_schema(AVRO_ORDER).arrow
PARSED_AVRO_ORDER = fastavro.parse_schema(AVRO_ORDER)
ORDER_VERSION = SchemaVersion(
    "5f0e2c1a-0000-4000-8000-000000000001",
    "arn:aws:glue:us-east-1:123456789012:schema/shop/orders",
    1,
    "AVRO",
    json.dumps(AVRO_ORDER),
)
# The orders as Protobuf: no 64-bit integers, bytes or well-known types, whose JSON mapping (strings,
# base64, RFC 3339 text) is not their Arrow value, so that the loop's rows fit the same schema.
ORDER_PROTO = """
syntax = "proto3";
package bench;
message Order {
  enum Currency { CURRENCY_UNSPECIFIED = 0; EUR = 1; USD = 2; }
  message Customer { int32 id = 1; string country = 2; }
  string order_id = 1;
  double amount = 2;
  int32 quantity = 3;
  Currency currency = 4;
  Customer customer = 5;
  string note = 6;
  repeated string tags = 7;
  map<string, int32> counts = 8;
}
"""
ORDER_MESSAGE = compile_proto(ORDER_PROTO).messages["bench.Order"]
Row = dict[str, Any]
Decode = Callable[[UserRecords], pa.Table]


def orders(count: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "order_id": f"order-{n:08d}",
                "amount": n * 0.25,
                "quantity": n % 7,
                "currency": "EUR",
                "placed_at": "2026-11-29T01:00:00Z",
                "customer": {"id": n % 1000, "country": "PT"},
                "note": "x" * (n % 40),
            }
        ).encode()
        for n in range(count)
    ]


def avro_order(n: int) -> dict[str, Any]:
    return {
        "order_id": f"order-{n:08d}",
        "amount": n * 0.25,
        "quantity": n % 7,
        "currency": "EUR",
        "placed_at": datetime(2026, 11, 29, 1, 0, tzinfo=UTC),
        "customer": {"id": n % 1000, "country": "PT"},
        "note": "x" * (n % 40) if n % 3 else None,
    }


def avro_orders(count: int) -> list[bytes]:
    return [avro_datum(AVRO_ORDER, avro_order(n)) for n in range(count)]


def gsr_orders(count: int) -> list[bytes]:
    return [gsr_framed(ORDER_VERSION.version_id, payload, n % 2 == 0) for n, payload in enumerate(avro_orders(count))]


def protobuf_orders(count: int) -> list[bytes]:
    return [
        ORDER_MESSAGE(
            order_id=f"order-{n:08d}",
            amount=n * 0.25,
            quantity=n % 7,
            currency=1,
            customer={"id": n % 1000, "country": "PT"},
            note="x" * (n % 40),
            tags=["gift"] * (n % 3),
            counts={"items": n % 5},
        ).SerializeToString()
        for n in range(count)
    ]


def subscription_records(count: int) -> list[bytes]:
    return [
        data_message(f"/app/{n % 5}", f"i-{n}", log_events(f"/app/{n % 5}", n * 10, 1 + n % 5)) for n in range(count)
    ]


def changes(count: int) -> list[bytes]:
    out = []
    for n in range(count):
        key = {"order_id": {"S": f"order-{n:08d}"}}
        image = {**key, "price": {"N": str(n)}, "status": {"S": "placed"}, "tags": {"SS": ["a", "b"]}}
        out.append(change_record("MODIFY", key, new_image=image, old_image={**image, "status": {"S": "new"}}))
    return out


def order_row(payload: bytes) -> list[Row]:
    order = json.loads(payload)
    row = {name: order.get(name) for name in ORDER_SCHEMA.names}
    placed = row["placed_at"]
    row["placed_at"] = None if placed is None else datetime.fromisoformat(placed)
    return [row]


def protobuf_order_row(payload: bytes) -> list[Row]:
    message = ORDER_MESSAGE.FromString(payload)
    return [
        json_format.MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    ]


def log_event_rows(payload: bytes) -> list[Row]:
    envelope = json.loads(gzip.decompress(payload))
    if envelope["messageType"] != "DATA_MESSAGE":
        return []
    shared = {
        "owner": envelope["owner"],
        "log_group": envelope["logGroup"],
        "log_stream": envelope["logStream"],
        "subscription_filters": envelope["subscriptionFilters"],
    }
    return [
        {
            **shared,
            "id": event["id"],
            "timestamp": datetime.fromtimestamp(event["timestamp"] / 1000, UTC),
            "message": event["message"],
        }
        for event in envelope["logEvents"]
    ]


def change_row(payload: bytes) -> list[Row]:
    record = json.loads(payload)
    change = record["dynamodb"]
    images = {
        name: change.get(field)
        for name, field in (("keys", "Keys"), ("new_image", "NewImage"), ("old_image", "OldImage"))
    }
    return [
        {
            "event_id": record["eventID"],
            "event_name": record["eventName"],
            "table_name": record["tableName"],
            "aws_region": record["awsRegion"],
            "user_identity_type": (record.get("userIdentity") or {}).get("type"),
            "approximate_creation_time": datetime.fromtimestamp(change["ApproximateCreationDateTime"] / 1000, UTC),
            "size_bytes": change["SizeBytes"],
            **{name: None if image is None else json.dumps(image) for name, image in images.items()},
        }
    ]


def avro_order_row(payload: bytes, schema: Any = PARSED_AVRO_ORDER) -> list[Row]:
    datum = fastavro.schemaless_reader(io.BytesIO(payload), schema)
    assert isinstance(datum, dict)  # a record schema's
    return [datum]


def gsr_order_row(payload: bytes) -> list[Row]:
    if payload[0] != 3 or payload[1] not in (0, 5):
        raise ValueError("not framed by the Glue Schema Registry serializer")
    schema = GSR_SCHEMAS[str(UUID(bytes=payload[2:18]))]
    data = zlib.decompress(payload[18:]) if payload[1] == 5 else payload[18:]
    return avro_order_row(data, schema)


GSR_SCHEMAS = {ORDER_VERSION.version_id: PARSED_AVRO_ORDER}  # the loop's registry: parsed once, by version id


def per_record_loop(rows_of: Callable[[bytes], list[Row]], schema: pa.Schema) -> Decode:
    full = pa.schema([*POSITION_SCHEMA, *schema])

    def decode(records: UserRecords) -> pa.Table:
        rows: list[Row] = []
        for record in records:
            position = {name: getattr(record, name) for name in POSITION_COLUMNS}
            rows.extend({**position, **row} for row in rows_of(record.data))
        return pa.Table.from_pylist(rows, schema=full)

    return decode


def batches(payloads: Sequence[bytes], size: int) -> list[UserRecords]:
    """The payloads as records, in batches as a slot hands them to its decoder: columns (`UserRecords`)."""
    records = [KinesisRecord(str(10**20 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]
    return [UserRecords.of(records[start : start + size]) for start in range(0, len(records), size)]


def cpu_seconds(decode: Decode, work: list[UserRecords]) -> tuple[float, int]:
    started = time.process_time()
    rows = sum(decode(batch).num_rows for batch in work)
    return time.process_time() - started, rows


def built_in_decoder(name: str, options: dict[str, Any]) -> RecordDecoder:
    decoder = load_decoder(name, options)
    assert decoder is not None
    return decoder


def decoding(decoder: RecordDecoder) -> Decode:
    def decode(batch: UserRecords) -> pa.Table:
        decoded = decoder.decode_batch(batch, "bench", "shardId-000000000000")
        assert not decoded.rejected, decoded.rejected[0].error
        return decoded.table

    return decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    cases = {
        "json": (orders, built_in_decoder("json", {"schema": ORDER}), per_record_loop(order_row, ORDER_SCHEMA)),
        "cloudwatch_logs": (
            subscription_records,
            built_in_decoder("cloudwatch_logs", {}),
            per_record_loop(log_event_rows, LOG_EVENT_SCHEMA),
        ),
        "dynamodb": (changes, built_in_decoder("dynamodb", {}), per_record_loop(change_row, CHANGE_SCHEMA)),
        "avro": (
            avro_orders,
            built_in_decoder("avro", {"schema": AVRO_ORDER}),
            per_record_loop(avro_order_row, AVRO_ORDER_SCHEMA),
        ),
        "protobuf": (
            protobuf_orders,
            built_in_decoder("protobuf", {"schema": ORDER_PROTO, "message": "bench.Order"}),
            per_record_loop(protobuf_order_row, arrow_schema(ORDER_MESSAGE)),
        ),
        "glue_schema_registry": (
            gsr_orders,
            GlueSchemaRegistryDecoder(registry=VersionTable((ORDER_VERSION,))),
            per_record_loop(gsr_order_row, AVRO_ORDER_SCHEMA),
        ),
    }
    print(f"{arguments.records} records a decoder, batches of {arguments.batch}, least CPU of {arguments.repeats}")
    print("| Decoder | Payload MiB | Rows | Decoder MiB/CPU s | Loop MiB/CPU s | Decoder / loop |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (make, decoder, loop) in cases.items():
        payloads = make(arguments.records)
        mib = sum(map(len, payloads)) / 2**20
        work = batches(payloads, arguments.batch)
        built_in = decoding(decoder)
        built_in(work[0]), loop(work[0])  # the imports a first call makes
        best_decoder = best_loop = float("inf")
        for _ in range(arguments.repeats):
            seconds, rows = cpu_seconds(built_in, work)
            best_decoder = min(best_decoder, seconds)
            seconds, loop_rows = cpu_seconds(loop, work)
            best_loop = min(best_loop, seconds)
            assert rows == loop_rows, (name, rows, loop_rows)
        print(
            f"| `{name}` | {mib:.1f} | {rows} | {mib / best_decoder:.1f} | {mib / best_loop:.1f} "
            f"| {best_loop / best_decoder:.1f}x |"
        )


if __name__ == "__main__":
    main()
