"""Sample user transforms, named in tests by specs such as "tests.support.transforms:with_payload_size"."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

NOT_CALLABLE = 42


def with_payload_size(table: pa.Table) -> pa.Table:
    """Adds `payload_size`, the length of `data` in bytes."""
    return table.append_column("payload_size", pc.binary_length(table["data"]))


def without_empty_payloads(table: pa.Table) -> pa.Table:
    """Drops the records whose `data` is empty."""
    return table.filter(pc.greater(pc.binary_length(table["data"]), 0))


def with_partition_columns(table: pa.Table) -> pa.Table:
    """Adds the partition columns, which the sink refuses: they belong in the directory names."""
    rows = table.num_rows
    return table.append_column("stream_name", pa.array(["s"] * rows)).append_column("shard_id", pa.array(["x"] * rows))


def failing(table: pa.Table) -> pa.Table:
    raise ValueError(f"cannot decode {table.num_rows} payloads")


def row_count(table: pa.Table) -> int:
    """Returns a number instead of a table."""
    return table.num_rows


def failing_on_the_first_shard(table: pa.Table) -> pa.Table:
    """Raises on every batch of the stream's first shard (a shard that stops landing); leaves the others be."""
    if table.num_rows and table["shard_id"][0].as_py() == "shardId-000000000000":
        raise ValueError(f"cannot decode {table.num_rows} payloads of shardId-000000000000")
    return table
