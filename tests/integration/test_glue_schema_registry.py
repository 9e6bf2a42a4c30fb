"""The glue_schema_registry decoder against Glue's schema registry (moto's, on loopback): versions
looked up by id and by number, each once per process, and records of two versions decoded with the
columns the registry's versions give them."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest

from lease_core.retrieval.kinesis_records import KinesisRecord
from spark_jobs.decoders.glue_schema_registry import GlueSchemaRegistry, GlueSchemaRegistryDecoder
from tests.support.avro_payloads import avro_datum, gsr_framed, registered_versions

ARRIVAL = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)
V1 = {"type": "record", "name": "Order", "fields": [{"name": "order_id", "type": "string"}]}
V2 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "coupon", "type": ["null", "string"], "default": None}],
}
UNKNOWN = "99999999-9999-9999-9999-999999999999"


@pytest.fixture
def glue(moto_endpoint: str):
    return boto3.client("glue", endpoint_url=moto_endpoint, region_name="us-east-1")


def test_a_version_is_found_by_its_id_and_by_its_number_with_its_data_format_and_definition(
    glue, moto_endpoint, unique_name
):
    first, second = registered_versions(glue, unique_name, "orders", [V1, V2])
    registry = GlueSchemaRegistry(moto_endpoint)

    by_id = registry.by_id(second)
    assert by_id is not None
    assert (by_id.version_number, by_id.data_format, by_id.schema_arn.endswith(f"schema/{unique_name}/orders")) == (
        2,
        "AVRO",
        True,
    )
    assert registry.by_number(by_id.schema_arn, 1) == registry.by_id(first)
    assert registry.by_id(UNKNOWN) is None
    assert registry.by_number(by_id.schema_arn, 3) is None


def test_a_version_once_fetched_is_kept_for_the_process_even_when_glue_no_longer_has_it(
    glue, moto_endpoint, unique_name
):
    (first,) = registered_versions(glue, unique_name, "orders", [V1])
    registry = GlueSchemaRegistry(moto_endpoint)
    kept = registry.by_id(first)

    glue.delete_schema(SchemaId={"RegistryName": unique_name, "SchemaName": "orders"})

    assert GlueSchemaRegistry(moto_endpoint).by_id(first) is None, "Glue has it no more"
    assert registry.by_id(first) == kept


def test_records_of_two_registered_versions_decode_with_both_versions_columns_and_an_unknown_version_is_rejected(
    glue, moto_endpoint, unique_name
):
    first, second = registered_versions(glue, unique_name, "orders", [V1, V2])
    payloads = [
        gsr_framed(first, avro_datum(V1, {"order_id": "o-0"})),
        gsr_framed(second, avro_datum(V2, {"order_id": "o-1", "coupon": "c-1"}), compress=True),
        gsr_framed(UNKNOWN, avro_datum(V1, {"order_id": "o-2"})),
    ]
    records = [KinesisRecord(str(100 + n), 0, f"key-{n}", ARRIVAL, payload) for n, payload in enumerate(payloads)]
    decoder = GlueSchemaRegistryDecoder.from_options({"endpoint_url": moto_endpoint})

    batch = decoder.decode_batch(records, "orders", "shardId-0")

    assert batch.table.select(["order_id", "coupon"]).to_pylist() == [
        {"order_id": "o-0", "coupon": None},
        {"order_id": "o-1", "coupon": "c-1"},
    ]
    assert [(rejected.record.sequence_number, rejected.error) for rejected in batch.rejected] == [
        (
            "102",
            f"the payload of record 102/0 of orders/shardId-0 has schema version {UNKNOWN}, "
            "which is not in the registry",
        )
    ]
