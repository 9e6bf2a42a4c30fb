"""Records framed by the Glue Schema Registry serializer through the consume job (a real local
SparkSession, kinesis-mock, moto's Glue registry) into an Iceberg table and a Delta table: the records
of version 1 land, then a version 2 with a new optional field adds its column, and the records that
are not framed or whose version the registry does not know land in the dead letters with the reason;
Avro records, and Protobuf records into Iceberg."""

from __future__ import annotations

import json

import boto3
import pytest

from devtools.kinesis_streams import put_entries
from sinks.dead_lettering import dead_letter_uri
from spark_jobs.decoders.protobuf_messages import compile_proto
from spark_jobs.record_processing import RecordProcessing
from tests.integration.test_consume_job_delta import delta_pipeline  # noqa: F401  # the fixture
from tests.integration.test_consume_job_json import rows
from tests.support.avro_payloads import avro_datum, gsr_framed, gsr_protobuf_data, registered_versions
from tests.support.pipeline import ConsumerPipeline

V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"}],
}
V2 = {**V1, "fields": [*V1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}]}
UNKNOWN = "99999999-9999-9999-9999-999999999999"


def produce(pipeline: ConsumerPipeline, payloads: list[bytes]) -> None:
    entries = [{"Data": payload, "PartitionKey": f"key-{n}"} for n, payload in enumerate(payloads)]
    put_entries(pipeline.kinesis, pipeline.streams[0], entries)


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_avro_records_of_two_registry_versions_land_with_the_registrys_columns_and_bad_ones_are_dead_lettered(
    spark, request, sink, moto_endpoint, unique_name
):
    pipeline: ConsumerPipeline = request.getfixturevalue("table_pipeline" if sink == "iceberg" else "delta_pipeline")
    glue = boto3.client("glue", endpoint_url=moto_endpoint, region_name="us-east-1")
    (first,) = registered_versions(glue, unique_name, "orders", [V1])
    processing = RecordProcessing.from_options(
        {
            "decode": "glue_schema_registry",
            "decode_options": {"endpoint_url": moto_endpoint},  # the test's Glue; in AWS, the job's environment's
            "bad_records": "dead_letter",
            "dead_letter_max_share": 1,
        }
    )
    produce(
        pipeline,
        [gsr_framed(first, avro_datum(V1, {"order_id": f"o-{n}", "amount": n * 1.5}), n % 2 == 0) for n in range(10)]
        + [b"\x02not framed by the serializer", gsr_framed(UNKNOWN, avro_datum(V1, {"order_id": "x", "amount": 1.0}))],
    )

    report = pipeline.round(spark, workers=2, processing=processing)
    assert report.succeeded, report.summary()
    landed = rows(pipeline.output_uri, pipeline.application_name)
    assert sorted(row["order_id"] for row in landed) == sorted(f"o-{n}" for n in range(10))
    assert "coupon" not in landed[0], "version 1 has no coupon"

    second = glue.register_schema_version(
        SchemaId={"RegistryName": unique_name, "SchemaName": "orders"}, SchemaDefinition=json.dumps(V2)
    )["SchemaVersionId"]
    produce(
        pipeline,
        [
            gsr_framed(second, avro_datum(V2, {"order_id": f"o-{n}", "amount": 1.0, "coupon": f"c-{n}"}))
            for n in range(10, 16)
        ],
    )
    again = pipeline.round(spark, workers=2, processing=processing)
    assert again.succeeded, again.summary()

    landed = rows(pipeline.output_uri, pipeline.application_name)
    assert sorted(row["order_id"] for row in landed) == sorted(f"o-{n}" for n in range(16)), "each order once"
    coupons = {row["order_id"]: row["coupon"] for row in landed}
    assert (coupons["o-3"], coupons["o-12"]) == (None, "c-12")
    assert next(row for row in landed if row["order_id"] == "o-4")["amount"] == 6.0
    dead = rows(dead_letter_uri(pipeline.output_uri), pipeline.application_name)
    reasons = sorted(row["error"] for row in dead)
    assert len(reasons) == 2 and {row["processing"] for row in dead} == {"glue_schema_registry"}, reasons
    assert any("has header version byte 2, not 3" in reason for reason in reasons), reasons
    assert any(f"has schema version {UNKNOWN}, which is not in the registry" in reason for reason in reasons), reasons


PROTO_V1 = """
syntax = "proto3";
package shop;
message Order {
  message Line { string sku = 1; int32 quantity = 2; }
  string order_id = 1;
  double amount = 2;
  repeated Line lines = 3;
}
"""
PROTO_V2 = PROTO_V1.replace("repeated Line lines = 3;", "repeated Line lines = 3;\n  optional string coupon = 4;")


def test_protobuf_records_of_two_registry_versions_land_in_iceberg_with_the_registrys_columns(
    spark, table_pipeline, moto_endpoint, unique_name
):
    pipeline: ConsumerPipeline = table_pipeline
    glue = boto3.client("glue", endpoint_url=moto_endpoint, region_name="us-east-1")
    first, second = registered_versions(glue, unique_name, "orders", [PROTO_V1, PROTO_V2], data_format="PROTOBUF")
    v1, v2 = (compile_proto(text).messages["shop.Order"] for text in (PROTO_V1, PROTO_V2))
    processing = RecordProcessing.from_options(
        {
            "decode": "glue_schema_registry",
            "decode_options": {"endpoint_url": moto_endpoint},
            "bad_records": "dead_letter",
            "dead_letter_max_share": 1,
        }
    )
    orders = [v1(order_id=f"o-{n}", amount=n * 1.5, lines=[{"sku": "tea", "quantity": n}]) for n in range(6)]
    produce(
        pipeline,
        [gsr_framed(first, gsr_protobuf_data(order), n % 2 == 0) for n, order in enumerate(orders)]
        + [gsr_framed(UNKNOWN, gsr_protobuf_data(v1(order_id="x")))]
        + [gsr_framed(first, b"\x00\xff\xff")],  # the message index, then bytes that are no Order
    )
    report = pipeline.round(spark, workers=2, processing=processing)
    assert report.succeeded, report.summary()
    landed = rows(pipeline.output_uri, pipeline.application_name)
    assert sorted(row["order_id"] for row in landed) == [f"o-{n}" for n in range(6)]
    assert "coupon" not in landed[0], "version 1 has no coupon"

    produce(pipeline, [gsr_framed(second, gsr_protobuf_data(v2(order_id="o-6", amount=2.0, coupon="c-6")))])
    again = pipeline.round(spark, workers=2, processing=processing)
    assert again.succeeded, again.summary()
    landed = {row["order_id"]: row for row in rows(pipeline.output_uri, pipeline.application_name)}
    assert sorted(landed) == [f"o-{n}" for n in range(7)], "each order once"
    assert (landed["o-3"]["coupon"], landed["o-6"]["coupon"]) == (None, "c-6")
    assert landed["o-4"]["lines"] == [{"sku": "tea", "quantity": 4}] and landed["o-4"]["amount"] == 6.0
    dead = rows(dead_letter_uri(pipeline.output_uri), pipeline.application_name)
    reasons = sorted(row["error"] for row in dead)
    assert len(reasons) == 2, reasons
    assert any(f"has schema version {UNKNOWN}, which is not in the registry" in reason for reason in reasons)
    assert any("is not a shop.Order message" in reason for reason in reasons), reasons
