"""The built-in glue_schema_registry decoder: the serializer's framing read, each version's records
decoded by its data format, columns merged across the schema's versions, bad records set aside.

The registry here is an in-process table of versions: what is under test is the framing and the
merge. Glue's own registry (moto's) is in tests/integration/test_glue_schema_registry.py."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord, UserRecords
from spark_jobs.decode import load_decoder
from spark_jobs.decoders.glue_schema_registry import GlueSchemaRegistryDecoder, SchemaVersion, merged_columns
from spark_jobs.errors import FunctionLoadError, TransformError
from tests.support.avro_payloads import VersionTable, avro_datum, gsr_framed

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
ORDERS = "arn:aws:glue:us-east-1:123456789012:schema/shop/orders"
V1 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "string"},
        {
            "name": "customer",
            "type": {"type": "record", "name": "Customer", "fields": [{"name": "id", "type": "long"}]},
        },
    ],
}
V2 = {  # adds an optional field, at the top and in the nested record
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "string"},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [
                    {"name": "id", "type": "long"},
                    {"name": "tier", "type": ["null", "string"], "default": None},
                ],
            },
        },
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
ID_1, ID_2, ID_3 = (
    "11111111-1111-1111-1111-111111111111",
    "22222222-2222-2222-2222-222222222222",
    "33333333-3333-3333-3333-333333333333",
)
UNKNOWN = "99999999-9999-9999-9999-999999999999"


def avro_version(version_id: str, number: int, definition: dict, schema_arn: str = ORDERS) -> SchemaVersion:
    return SchemaVersion(version_id, schema_arn, number, "AVRO", json.dumps(definition))


REGISTRY = VersionTable((avro_version(ID_1, 1, V1), avro_version(ID_2, 2, V2)))


def records(*payloads: bytes) -> list[KinesisRecord]:
    return [KinesisRecord(str(100 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]


def decoded(*payloads: bytes, registry: VersionTable = REGISTRY):
    return GlueSchemaRegistryDecoder(registry=registry).decode_batch(records(*payloads), "orders", "shardId-0")


def order_v1(n: int, compress: bool = False) -> bytes:
    return gsr_framed(ID_1, avro_datum(V1, {"order_id": f"o-{n}", "customer": {"id": n}}), compress)


def order_v2(n: int, compress: bool = False) -> bytes:
    value = {"order_id": f"o-{n}", "customer": {"id": n, "tier": "gold"}, "coupon": f"c-{n}"}
    return gsr_framed(ID_2, avro_datum(V2, value), compress)


def test_records_of_two_versions_land_in_their_order_with_the_columns_of_both_null_where_a_version_lacks_them():
    batch = decoded(order_v1(0), order_v2(1), order_v1(2, compress=True), order_v2(3, compress=True))
    assert batch.rejected == ()
    table = batch.table
    assert table.column("sequence_number").to_pylist() == ["100", "101", "102", "103"]
    assert table.select(["order_id", "customer", "coupon"]).to_pylist() == [
        {"order_id": "o-0", "customer": {"id": 0, "tier": None}, "coupon": None},
        {"order_id": "o-1", "customer": {"id": 1, "tier": "gold"}, "coupon": "c-1"},
        {"order_id": "o-2", "customer": {"id": 2, "tier": None}, "coupon": None},
        {"order_id": "o-3", "customer": {"id": 3, "tier": "gold"}, "coupon": "c-3"},
    ]


def test_a_batch_of_version_1_records_only_has_the_columns_of_version_1_and_a_redo_has_the_same():
    batch = decoded(order_v1(0), order_v1(1))
    assert batch.table.column_names[-2:] == ["order_id", "customer"]
    assert batch.table.equals(decoded(order_v1(0), order_v1(1)).table)


def test_a_batch_whose_newest_version_is_2_has_the_columns_of_versions_1_and_2_even_without_version_1_records():
    assert decoded(order_v2(0)).table.column_names[-3:] == ["order_id", "customer", "coupon"]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        pytest.param(
            b"\x03\x00abc", "is too short for a Glue Schema Registry header (5 bytes, the header is 18)", id="short"
        ),
        pytest.param(b"\x02" + order_v1(1)[1:], "has header version byte 2, not 3", id="header version"),
        pytest.param(
            order_v1(1)[:1] + b"\x07" + order_v1(1)[2:],
            "has compression byte 7, neither 0 (none) nor 5 (zlib)",
            id="compression byte",
        ),
        pytest.param(
            order_v1(1)[:1] + b"\x05" + order_v1(1)[2:],
            "has compression byte 5 (zlib) but its data is not zlib data",
            id="not zlib",
        ),
        pytest.param(
            gsr_framed(UNKNOWN, b"\x02a\x02"),
            f"has schema version {UNKNOWN}, which is not in the registry",
            id="unknown version",
        ),
        pytest.param(gsr_framed(ID_1, b"\x08o-"), "is not a datum of its Avro schema", id="not a datum of its version"),
    ],
)
def test_a_record_that_is_not_framed_or_not_of_its_version_is_rejected_with_the_reason(payload, reason):
    batch = decoded(order_v1(0), payload, order_v2(2))
    assert batch.table.column("order_id").to_pylist() == ["o-0", "o-2"]
    assert [rejected.record.sequence_number for rejected in batch.rejected] == ["101"]
    assert batch.rejected[0].error.startswith("the payload of record 101/0 of orders/shardId-0 ")
    assert reason in batch.rejected[0].error


def test_json_schema_records_are_read_by_the_json_reader_with_the_versions_columns():
    document = {"type": "object", "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}}}
    registry = VersionTable((SchemaVersion(ID_3, ORDERS, 1, "JSON", json.dumps(document)),))
    batch = decoded(
        gsr_framed(ID_3, b'{"order_id": "o-1", "amount": 2.5}'), gsr_framed(ID_3, b"{oops"), registry=registry
    )
    assert batch.table.select(["order_id", "amount"]).to_pylist() == [{"order_id": "o-1", "amount": 2.5}]
    assert [rejected.record.sequence_number for rejected in batch.rejected] == ["101"]


def test_a_field_whose_type_changes_refuses_the_batches_with_the_new_version_naming_the_field_and_both_versions():
    changed = {**V1, "fields": [{"name": "order_id", "type": "long"}, V1["fields"][1]]}
    registry = VersionTable((*REGISTRY.versions, avro_version(ID_3, 3, changed)))
    assert decoded(order_v1(0), registry=registry).rejected == ()  # its newest version is 1: the change is not its
    with pytest.raises(TransformError, match="field 'order_id' is string in version 1 and int64 in version 3"):
        decoded(gsr_framed(ID_3, avro_datum(changed, {"order_id": 1, "customer": {"id": 1}})), registry=registry)


def test_a_nested_fields_type_change_names_the_nested_field():
    first = pa.schema([("customer", pa.struct([("id", pa.int64())]))])
    later = pa.schema([("customer", pa.struct([("id", pa.string())]))])
    with pytest.raises(ValueError, match=r"field 'customer\.id' is int64 in version 1 and string in version 4"):
        merged_columns([(1, first), (4, later)])


@pytest.mark.parametrize("first", ["orders", "refunds"])
def test_records_of_a_schema_other_than_the_first_records_are_rejected_naming_both(first):
    other = "arn:aws:glue:us-east-1:123456789012:schema/shop/refunds"
    registry = VersionTable((*REGISTRY.versions, avro_version(ID_3, 1, V1, schema_arn=other)))
    refund = gsr_framed(ID_3, avro_datum(V1, {"order_id": "r", "customer": {"id": 1}}))
    payloads = (order_v1(0), refund, order_v1(1)) if first == "orders" else (refund, order_v1(0), order_v1(1))
    batch = decoded(*payloads, registry=registry)
    kept, stray = (ORDERS, other) if first == "orders" else (other, ORDERS)
    assert batch.table.num_rows == len(payloads) - len(batch.rejected) and batch.table.num_rows >= 1
    assert all(f"is of schema {stray}, the batch's records of {kept}" in r.error for r in batch.rejected)


def test_a_batch_whose_schema_lacks_a_version_up_to_its_newest_is_refused_naming_it():
    registry = VersionTable((avro_version(ID_2, 2, V2),))  # version 1 deleted from the registry
    with pytest.raises(TransformError, match=f"schema {ORDERS} has no version 1 in the registry"):
        decoded(order_v2(0), registry=registry)


def test_a_new_optional_field_inside_a_maps_values_is_merged_like_a_structs():
    line = pa.struct([("sku", pa.string())])
    wider = pa.struct([("sku", pa.string()), ("qty", pa.int64())])
    first = pa.schema([("lines", pa.map_(pa.string(), line))])
    later = pa.schema([("lines", pa.map_(pa.string(), wider))])
    assert merged_columns([(1, first), (2, later)]) == pa.schema([("lines", pa.map_(pa.string(), wider))])
    changed = pa.schema([("lines", pa.map_(pa.string(), pa.struct([("sku", pa.int64())])))])
    with pytest.raises(ValueError, match=r"field 'lines\{\}\.sku' is string in version 1 and int64 in version 2"):
        merged_columns([(1, first), (2, changed)])


def test_the_endpoint_option_round_trips_and_wrong_options_fail_loading_naming_them():
    decoder = GlueSchemaRegistryDecoder.from_options({"endpoint_url": "http://127.0.0.1:5000"})
    assert GlueSchemaRegistryDecoder.from_options(decoder.options()) == decoder
    with pytest.raises(FunctionLoadError, match="has no option 'registry'"):
        load_decoder("glue_schema_registry", {"registry": "shop"})
    with pytest.raises(FunctionLoadError, match="endpoint_url must be an http:// or https:// URL"):
        load_decoder("glue_schema_registry", {"endpoint_url": "glue"})


def test_zlib_framing_is_the_serializers_default_deflater_output():
    framed = order_v1(5, compress=True)
    assert framed[:2] == b"\x03\x05"
    assert zlib.decompress(framed[18:]) == avro_datum(V1, {"order_id": "o-5", "customer": {"id": 5}})


def test_a_batch_as_a_slot_hands_it_over_in_columns_decodes_as_the_same_records_one_by_one_do():
    batch = records(order_v1(0), b"\x03", order_v2(2, compress=True))
    decoder = GlueSchemaRegistryDecoder(registry=REGISTRY)
    as_columns = decoder.decode_batch(UserRecords.of(batch), "orders", "shardId-0")
    one_by_one = decoder.decode_batch(batch, "orders", "shardId-0")
    assert as_columns.table.equals(one_by_one.table)
    assert [rejected.error for rejected in as_columns.rejected] == [rejected.error for rejected in one_by_one.rejected]
