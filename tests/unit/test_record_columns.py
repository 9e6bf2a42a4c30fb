"""The columns of a batch's rows, whatever the sink: every field of a record, in the given order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.record_columns import RECORD_SCHEMA, records_table

ARRIVAL = datetime(2026, 11, 2, 8, 30, tzinfo=UTC)


def test_the_records_table_keeps_every_field_and_the_given_order() -> None:
    records = [
        KinesisRecord("20", 1, "k", ARRIVAL, b"\x00\xff", explicit_hash_key="170141183460469231731687303715884105728"),
        KinesisRecord("10", 0, "j", ARRIVAL + timedelta(seconds=1), b"", None),
    ]
    table = records_table(records)
    assert table.schema == RECORD_SCHEMA
    assert table.to_pylist() == [
        {
            "sequence_number": r.sequence_number,
            "sub_sequence_number": r.sub_sequence_number,
            "partition_key": r.partition_key,
            "approximate_arrival_timestamp": r.approximate_arrival_timestamp,
            "data": r.data,
            "explicit_hash_key": r.explicit_hash_key,
        }
        for r in records
    ]
