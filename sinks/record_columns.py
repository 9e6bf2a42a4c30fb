"""The columns of a batch's rows, whatever sink they land in (docs/architecture.md, "Sinks").

A batch is staged as a table of RECORD_SCHEMA, one row per user record in shard order (through the
user transform when there is one, which may change the columns). The columns every row of a batch
shares, BATCH_COLUMNS, are not in it: the sink takes them from the batch (`BatchRange`), and stores
them its own way (a Parquet dataset in its partition directories).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from lease_core.retrieval.kinesis_records import KinesisRecord, UserRecords

BATCH_COLUMNS = ("stream_name", "shard_id")
RECORD_SCHEMA = pa.schema(
    [
        pa.field("sequence_number", pa.string(), nullable=False),
        pa.field("sub_sequence_number", pa.int64(), nullable=False),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("explicit_hash_key", pa.string()),
    ]
)

# The record columns a decoded batch keeps: where each row came from (the payload is decoded instead).
POSITION_COLUMNS = ("sequence_number", "sub_sequence_number", "partition_key", "approximate_arrival_timestamp")
POSITION_SCHEMA = pa.schema([RECORD_SCHEMA.field(name) for name in POSITION_COLUMNS])


def records_table(records: Sequence[KinesisRecord]) -> pa.Table:
    """The records as a RECORD_SCHEMA table, in the given order: a read's columns (`UserRecords`) cast
    as they are (arrival times truncated to milliseconds), other records value by value."""
    return UserRecords.of(records).table.cast(RECORD_SCHEMA, safe=False)


def with_stream_and_shard(table: pa.Table, stream_name: str, shard_id: str) -> pa.Table:
    """The rows with the batch's stream and shard as their first columns (replacing any of the same
    names): how a table sink, unlike a dataset's partition folders, keeps them."""
    rows = table.drop_columns([name for name in BATCH_COLUMNS if name in table.column_names])
    for index, (name, value) in enumerate((("stream_name", stream_name), ("shard_id", shard_id))):
        # One value repeated, in C: a list of 16,000 references converted value by value took 0.4 ms.
        column = pa.repeat(pa.scalar(value, pa.string()), rows.num_rows)
        rows = rows.add_column(index, pa.field(name, pa.string(), nullable=False), column)
    return rows
