"""The built-in json and dynamodb decoders through the consume job (a real local SparkSession, kinesis-mock, moto):
JSON records land as typed columns in an Iceberg table and a Delta table, the records that do not fit
land in the dead letters with their reason, and a second round lands its new records beside the first's, none twice."""

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


def order(n: int) -> dict[str, Any]:
    return {"order_id": f"o-{n}", "amount": n * 1.5, "customer": {"id": n % 3}}


def produce_orders(pipeline: ConsumerPipeline, numbers: range, bad: bool) -> list[dict[str, Any]]:
    """The orders numbered `numbers`, and (`bad`) three records that are no order: not JSON, an amount
    that is text, no order_id."""
    orders = [order(n) for n in numbers]
    payloads = [json.dumps(one).encode() for one in orders]
    if bad:
        payloads += [b"{not json", json.dumps({"order_id": "bad", "amount": "lots"}).encode(), b'{"amount": 1}']
    entries = [{"Data": payload, "PartitionKey": f"key-{n}"} for n, payload in enumerate(payloads)]
    put_entries(pipeline.kinesis, pipeline.streams[0], entries)
    return orders


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
    first = produce_orders(pipeline, range(20), bad=True)

    report = pipeline.round(spark, workers=2, processing=PROCESSING)
    second = produce_orders(pipeline, range(20, 30), bad=False)
    again = pipeline.round(spark, workers=2, processing=PROCESSING)

    assert report.succeeded and again.succeeded, report.summary()
    assert (report.totals.records, again.totals.records) == (23, 10), "the second round reads only its new records"
    landed = rows(pipeline.output_uri, pipeline.application_name)
    columns = ("order_id", "amount", "customer")
    assert sorted(tuple(row[name] for name in columns) for row in landed) == sorted(
        tuple(one[name] for name in columns) for one in first + second
    ), "each order of both rounds once, as it was sent"
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
