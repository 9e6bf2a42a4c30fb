"""How the Iceberg sink stages batches. Its data files are pyiceberg's own: a staged batch's files, byte
for byte, and their DataFile entries (partition, statistics, field ids) are what pyiceberg's
`_dataframe_to_data_files` writes for the same rows in the table's schema and partition spec of the
moment, through schema evolution and partition spec changes between batches. A slot's leases staging at
once load (or create) the table as often as one lease alone."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from lease_core.model.sequence import TRIM_HORIZON
from sinks.batch_sink import BatchRange
from sinks.table.iceberg import IcebergSink, as_table_types, with_batch_columns
from sinks.table.iceberg_data_files import single_partition_key
from tests.support.iceberg_tables import APPLICATION, batch_of, position, rows, sink_on

NOON = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def arrivals(count: int, start: datetime = NOON, step: timedelta = timedelta(seconds=1)) -> pa.Array:
    return pa.array([start + step * n for n in range(count)], pa.timestamp("ms", tz="UTC"))


def in_chunks(table: pa.Table, size: int) -> pa.Table:
    """The same rows in chunks of `size`, as a batch read in several GetRecords answers arrives."""
    return pa.concat_tables(table.slice(offset, size) for offset in range(0, table.num_rows, size))


@dataclass(frozen=True)
class WrittenFile:
    """A data file as written: its DataFile entry, field by field (DataFile's own equality compares the
    path alone; its spec id is its manifest's), and its bytes."""

    path: str
    record_count: int
    entry: tuple[Any, ...]
    data: bytes


def written(table: Table, data_files: list[DataFile]) -> list[WrittenFile]:
    files = []
    for data_file in data_files:
        entry = (
            data_file.content,
            data_file.file_format,
            data_file.partition,
            data_file.file_size_in_bytes,
            data_file.column_sizes,
            data_file.value_counts,
            data_file.null_value_counts,
            data_file.nan_value_counts,
            data_file.lower_bounds,
            data_file.upper_bounds,
            data_file.key_metadata,
            data_file.split_offsets,
            data_file.equality_ids,
            data_file.sort_order_id,
        )
        with table.io.new_input(data_file.file_path).open() as stream:
            files.append(WrittenFile(data_file.file_path, data_file.record_count, entry, stream.read()))
    return files


def staged_and_pyicebergs(
    sink: IcebergSink, batch: BatchRange, batch_rows: pa.Table
) -> tuple[list[WrittenFile], list[WrittenFile]]:
    """The data files `stage` wrote for the batch (as its manifest lists them, and their bytes), and
    what pyiceberg's own path writes for the same rows under the same names, in the table as staged."""
    staged = sink.stage(batch, batch_rows, "a")
    table = sink.table()
    assert table is not None
    assert staged.token is not None
    receipt = sink.read_receipt(staged.token)
    ours = written(table, sink.staged_data_files(table, receipt))
    typed = as_table_types(with_batch_columns(batch_rows, batch), table.schema())
    pyicebergs = list(
        _dataframe_to_data_files(table.metadata, typed, table.io, write_uuid=uuid.UUID(receipt.receipt_id))
    )
    return ours, written(table, pyicebergs)


def partition_folders(data_file_path: str) -> list[str]:
    return [part.partition("=")[0] for part in data_file_path.split("/") if "=" in part]


def field_ids(table: Table, data_file_path: str) -> dict[str, int]:
    with table.io.new_input(data_file_path).open() as stream:
        schema = pq.read_schema(stream)
    return {field.name: int(field.metadata[b"PARQUET:field_id"]) for field in schema}


def payloads(count: int, size: int = 750) -> pa.Array:
    return pa.array([f"payload {n}".encode().ljust(size, b".") for n in range(count)], pa.binary())


BATCHES = {
    "one day": rows(1, 50, approximate_arrival_timestamp=arrivals(50)),
    "one day, in chunks": in_chunks(rows(1, 50, approximate_arrival_timestamp=arrivals(50)), 7),
    # Pages end where chunks end: several MiB in chunks are written otherwise than in one chunk.
    "one day, 3.6 MiB in chunks": in_chunks(
        rows(1, 5000, approximate_arrival_timestamp=arrivals(5000), data=payloads(5000)), 2000
    ),
    "across midnight": rows(
        1, 50, approximate_arrival_timestamp=arrivals(50, NOON.replace(hour=23, minute=59, second=40))
    ),
    "three days": rows(1, 6, approximate_arrival_timestamp=arrivals(6, step=timedelta(hours=12))),
}


@pytest.mark.parametrize("batch_rows", BATCHES.values(), ids=BATCHES.keys())
def test_a_staged_batchs_data_files_are_pyicebergs_byte_for_byte_with_the_same_entries(iceberg_catalog, batch_rows):
    sink = sink_on(iceberg_catalog)

    ours, pyicebergs = staged_and_pyicebergs(sink, batch_of(TRIM_HORIZON, 1, batch_rows.num_rows), batch_rows)

    assert ours == pyicebergs
    assert sum(file.record_count for file in ours) == batch_rows.num_rows


def test_the_files_stay_pyicebergs_after_a_new_column_and_each_partition_spec_change(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    first = rows(1, 20, approximate_arrival_timestamp=arrivals(20))
    ours, pyicebergs = staged_and_pyicebergs(sink, batch_of(TRIM_HORIZON, 1, 20), first)
    assert ours == pyicebergs

    # A transform adds a column: the sink evolves the schema, and the next files carry the column's id.
    amounts = pa.array([n / 2 for n in range(20)], pa.float64())
    second = rows(21, 20, approximate_arrival_timestamp=arrivals(20), amount=amounts)
    ours, pyicebergs = staged_and_pyicebergs(sink, batch_of(position(20), 21, 20), second)
    assert ours == pyicebergs
    table = sink.table()
    assert field_ids(table, ours[0].path)["amount"] == table.schema().find_field("amount").field_id

    # Another writer partitions by shard as well, then by shard alone, then not at all: each batch is
    # written in the spec of the table the sink has loaded, never one it saw before.
    changes = [
        lambda update: update.add_identity("shard_id"),
        lambda update: update.remove_field("arrival_day"),
        lambda update: update.remove_field("shard_id"),
    ]
    for number, change in enumerate(changes, start=3):
        with table.update_spec() as update:
            change(update)
        table = sink.table(refresh=True)
        first_number = number * 100
        batch_rows = rows(first_number, 20, approximate_arrival_timestamp=arrivals(20), amount=amounts)
        ours, pyicebergs = staged_and_pyicebergs(
            sink, batch_of(position(first_number - 1), first_number, 20), batch_rows
        )
        assert ours == pyicebergs
        assert [partition_folders(file.path) for file in ours] == [[field.name for field in table.spec().fields]]


def test_rows_of_one_partition_are_found_as_one_and_others_are_left_to_pyiceberg(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    one_day = rows(1, 10, approximate_arrival_timestamp=arrivals(10))
    sink.stage(batch_of(TRIM_HORIZON, 1, 10), one_day, "a")
    table = sink.table()
    typed = as_table_types(with_batch_columns(one_day, batch_of(TRIM_HORIZON, 1, 10)), table.schema())

    key = single_partition_key(table.metadata, typed)

    assert key is not None and key.to_path() == "arrival_day=2026-11-28"
    two_days = typed.set_column(
        typed.schema.get_field_index("approximate_arrival_timestamp"),
        typed.schema.field("approximate_arrival_timestamp"),
        arrivals(10, step=timedelta(hours=6)).cast(typed.schema.field("approximate_arrival_timestamp").type),
    )
    assert single_partition_key(table.metadata, two_days) is None


def catalog_calls_staging(catalog: Any, sink: IcebergSink, leases: int) -> dict[str, int]:
    """The catalog's table loads and creations while `leases` leases stage a first batch each, all at once."""
    calls = {"load_table": 0, "create_table": 0}
    for name in calls:
        method = getattr(catalog, name)

        def counted(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(catalog, name, counted)
    together = threading.Barrier(leases)

    def stage(lease: int) -> int:
        together.wait()
        return sink.stage(batch_of(TRIM_HORIZON, 1, 10, f"shardId-{lease:012d}"), rows(1, 10), "a").rows

    with ThreadPoolExecutor(leases) as pool:
        assert list(pool.map(stage, range(leases))) == [10] * leases
    for name in calls:
        delattr(catalog, name)
    return calls


def test_a_slots_leases_staging_their_first_batches_at_once_reach_the_catalog_as_one_lease_alone(iceberg_catalog):
    alone = IcebergSink("iceberg://lake/kinesis.alone", APPLICATION, catalog=iceberg_catalog)
    at_once = sink_on(iceberg_catalog)

    assert catalog_calls_staging(iceberg_catalog, at_once, 8) == catalog_calls_staging(iceberg_catalog, alone, 1)
