"""Batches the json decoder infers apart land in one Iceberg table and one Delta table (the real
sinks, on a local catalog and folder), whatever values each batch happens to hold: an integer where
an earlier batch had a fraction, a first value where an earlier batch had only nulls, text where an
earlier batch had a date."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lease_core.model.sequence import TRIM_HORIZON
from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.table.delta import DeltaSink
from spark_jobs.decoders.json_objects import JsonDecoder
from tests.support.delta_tables import delta_rows
from tests.support.iceberg_tables import APPLICATION, ARRIVAL, IDENTITY, STREAM, batch_of, position, sink_on

LEASE = "shardId-000000000001"
BATCHES = [
    [{"order_id": "a", "amount": 3, "note": None, "lines": []}, {"order_id": "b", "amount": 4, "day": "2026-11-29"}],
    [{"order_id": "c", "amount": 1.5, "note": "gift", "lines": [{"sku": "x", "count": 2}], "day": "tomorrow"}],
    [{"order_id": "d", "amount": 2, "lines": [{"sku": "y", "count": 1.5}]}],
]


@pytest.mark.parametrize("table_format", ["iceberg", "delta"])
def test_batches_of_json_inferred_apart_land_in_one_table_whatever_values_each_holds(
    table_format, request, tmp_path: Path
):
    sink = (
        sink_on(request.getfixturevalue("iceberg_catalog"))
        if table_format == "iceberg"
        else DeltaSink(f"delta:{tmp_path / 'orders'}", APPLICATION)
    )
    record, start, first = None, TRIM_HORIZON, 1
    for orders in BATCHES:
        records = [
            KinesisRecord(str(first + n), 0, f"key-{n}", ARRIVAL, json.dumps(order).encode())
            for n, order in enumerate(orders)
        ]
        decoded = JsonDecoder().decode_batch(records, STREAM, LEASE)
        assert decoded.rejected == ()
        record = sink.commit_record(record, sink.stage(batch_of(start, first, len(orders)), decoded.table, "a"))
        start, first = position(first + len(orders) - 1), first + len(orders)
    assert record is not None
    sink.publish_round({LEASE: record}, IDENTITY)

    table = (
        sink.table(refresh=True).scan().to_arrow()
        if table_format == "iceberg"
        else delta_rows(str(tmp_path / "orders"))
    )
    landed = sorted(table.select(["order_id", "amount", "note", "lines", "day"]).to_pylist(), key=str)
    assert landed == [
        {"order_id": "a", "amount": 3.0, "note": None, "lines": None, "day": None},
        {"order_id": "b", "amount": 4.0, "note": None, "lines": None, "day": "2026-11-29"},
        {"order_id": "c", "amount": 1.5, "note": "gift", "lines": [{"sku": "x", "count": 2.0}], "day": "tomorrow"},
        {"order_id": "d", "amount": 2.0, "note": None, "lines": [{"sku": "y", "count": 1.5}], "day": None},
    ]
