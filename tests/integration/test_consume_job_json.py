"""The built-in json and dynamodb decoders through the consume job (a real local SparkSession, kinesis-mock, moto):
JSON records land as typed columns in an Iceberg table and a Delta table, the records that do not fit
land in the dead letters with their reason, and a redo lands nothing twice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devtools.kinesis_streams import put_entries
from sinks.dead_lettering import dead_letter_uri
from sinks.table.iceberg import IcebergSink
from spark_jobs.record_processing import RecordProcessing
from tests.integration.test_consume_job_delta import delta_pipeline  # noqa: F401  # the fixture
from tests.support.delta_tables import delta_rows
from tests.support.dynamodb_changes import change_record
from tests.support.pipeline import ConsumerPipeline

ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "number"},
        "customer": {"type": "object", "properties": {"id": {"type": "integer"}}},
    },
    "required": ["order_id"],
}
PROCESSING = RecordProcessing.from_options(
    {"decode": "json", "decode_options": {"schema": ORDER}, "bad_records": "dead_letter", "dead_letter_max_share": 1}
)


def produce_orders(pipeline: ConsumerPipeline) -> set[str]:
    """Twenty orders, and three records that are no order: not JSON, an amount that is text, no order_id."""
    orders = [{"order_id": f"o-{n}", "amount": n * 1.5, "customer": {"id": n % 3}} for n in range(20)]
    payloads = [json.dumps(order).encode() for order in orders]
    payloads += [b"{not json", json.dumps({"order_id": "bad", "amount": "lots"}).encode(), b'{"amount": 1}']
    entries = [{"Data": payload, "PartitionKey": f"key-{n}"} for n, payload in enumerate(payloads)]
    put_entries(pipeline.kinesis, pipeline.streams[0], entries)
    return {order["order_id"] for order in orders}


def rows(output_uri: str, application: str) -> list[dict[str, Any]]:
    if output_uri.startswith("delta:"):
        return delta_rows(output_uri.removeprefix("delta:")).to_pylist()
    table = IcebergSink(output_uri, application).table(refresh=True)
    return [] if table is None else table.scan().to_arrow().to_pylist()


@pytest.mark.parametrize("sink", ["iceberg", "delta"])
def test_json_records_land_as_typed_columns_once_and_the_bad_ones_in_the_dead_letters_with_their_reason(
    spark, request, sink
):
    pipeline: ConsumerPipeline = request.getfixturevalue("table_pipeline" if sink == "iceberg" else "delta_pipeline")
    orders = produce_orders(pipeline)

    report = pipeline.round(spark, workers=2, processing=PROCESSING)
    again = pipeline.round(spark, workers=2, processing=PROCESSING)

    assert report.succeeded and again.succeeded, report.summary()
    landed = rows(pipeline.output_uri, pipeline.application_name)
    assert sorted(row["order_id"] for row in landed) == sorted(orders), "each order once"
    one = next(row for row in landed if row["order_id"] == "o-4")
    assert (one["amount"], one["customer"]) == (6.0, {"id": 1})
    dead = rows(dead_letter_uri(pipeline.output_uri), pipeline.application_name)
    reasons = sorted(row["error"] for row in dead)
    assert len(reasons) == 3 and {row["processing"] for row in dead} == {"json"}
    assert any("Column(/amount) changed from number to string" in reason for reason in reasons), reasons
    assert any("misses the required field 'order_id'" in reason for reason in reasons), reasons
    assert any(reason.endswith("Missing a name for object member.") for reason in reasons), reasons


def test_dynamodb_change_records_land_in_a_delta_table_as_rows_with_their_images_once(spark, request):
    delta: ConsumerPipeline = request.getfixturevalue("delta_pipeline")
    keys = [{"order_id": {"S": f"o-{n}"}} for n in range(12)]
    payloads = [change_record("INSERT", key, new_image={**key, "price": {"N": str(n)}}) for n, key in enumerate(keys)]
    payloads += [change_record("REMOVE", key, old_image=key) for key in keys[:4]]
    entries = [{"Data": payload, "PartitionKey": f"key-{n}"} for n, payload in enumerate(payloads)]
    put_entries(delta.kinesis, delta.streams[0], entries)
    processing = RecordProcessing.from_options({"decode": "dynamodb"})

    first = delta.round(spark, workers=2, processing=processing)
    assert first.succeeded, first.summary()
    again = delta.round(spark, workers=2, processing=processing)
    assert again.succeeded, again.summary()

    landed = rows(delta.output_uri, delta.application_name)
    assert sorted((row["event_name"], json.loads(row["keys"])["order_id"]["S"]) for row in landed) == sorted(
        [("INSERT", f"o-{n}") for n in range(12)] + [("REMOVE", f"o-{n}") for n in range(4)]
    )
    inserted = next(row for row in landed if row["event_name"] == "INSERT" and '"o-7"' in row["keys"])
    assert json.loads(inserted["new_image"])["price"] == {"N": "7"}
