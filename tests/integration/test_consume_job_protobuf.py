"""The built-in protobuf decoder through the consume job (a real local SparkSession, kinesis-mock, moto):
Protobuf messages land as typed columns in an Iceberg table once, the payloads that do not parse land
in the dead letters with their reason."""

from __future__ import annotations

from datetime import UTC, datetime

from devtools.kinesis_streams import put_entries
from sinks.dead_lettering import dead_letter_uri
from spark_jobs.decoders.protobuf_messages import compile_proto
from spark_jobs.record_processing import RecordProcessing
from tests.integration.test_consume_job_json import rows
from tests.support.pipeline import ConsumerPipeline

ORDERS = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  enum Status { STATUS_UNSPECIFIED = 0; PAID = 1; }
  message Line { string sku = 1; int32 quantity = 2; }
  string order_id = 1;
  google.protobuf.Timestamp placed_at = 2;
  Status status = 3;
  repeated Line lines = 4;
  map<string, string> tags = 5;
}
"""
PROCESSING = RecordProcessing.from_options(
    {
        "decode": "protobuf",
        "decode_options": {"schema": ORDERS},
        "bad_records": "dead_letter",
        "dead_letter_max_share": 1,
    }
)
PLACED = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


def test_protobuf_records_land_as_typed_columns_once_and_the_bad_ones_in_the_dead_letters_with_their_reason(
    spark, table_pipeline: ConsumerPipeline
):
    order = compile_proto(ORDERS).messages["shop.Order"]
    payloads = []
    for n in range(15):
        message = order(order_id=f"o-{n}", status=n % 2, tags={"channel": "web"})
        message.lines.add(sku=f"sku-{n}", quantity=n)
        message.placed_at.FromDatetime(PLACED)
        payloads.append(message.SerializeToString())
    payloads += [b"\xff\xff\xff", b"\x0a\x02\xff\xfe"]  # not a message; a string that is not UTF-8
    entries = [{"Data": payload, "PartitionKey": f"key-{n}"} for n, payload in enumerate(payloads)]
    put_entries(table_pipeline.kinesis, table_pipeline.streams[0], entries)

    report = table_pipeline.round(spark, workers=2, processing=PROCESSING)
    again = table_pipeline.round(spark, workers=2, processing=PROCESSING)

    assert report.succeeded and again.succeeded, report.summary()
    landed = rows(table_pipeline.output_uri, table_pipeline.application_name)
    assert sorted(row["order_id"] for row in landed) == sorted(f"o-{n}" for n in range(15)), "each order once"
    one = next(row for row in landed if row["order_id"] == "o-3")
    assert (one["status"], one["lines"], one["placed_at"]) == ("PAID", [{"sku": "sku-3", "quantity": 3}], PLACED)
    assert dict(one["tags"]) == {"channel": "web"}
    dead = rows(dead_letter_uri(table_pipeline.output_uri), table_pipeline.application_name)
    reasons = sorted(row["error"] for row in dead)
    assert len(reasons) == 2 and {row["processing"] for row in dead} == {"protobuf"}
    assert all("is not a shop.Order message" in reason for reason in reasons), reasons
    assert any("UTF-8" in reason for reason in reasons), reasons
