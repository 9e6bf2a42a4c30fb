"""How the Iceberg sink stages batches. Its data files are what pyiceberg's `_dataframe_to_data_files`
writes for the same rows in the table's schema and partition spec of the moment, given the sink's Arrow
settings (the table's page row limit as a page's row limit, not as Arrow's write batch size): byte for
byte for a batch in one chunk, and the same rows and DataFile entries (partition, statistics, field ids)
for a batch in several, through schema evolution and partition spec changes between batches. With
pyiceberg's own settings only the pages differ; pyiceberg and DuckDB read every row back. A slot's leases
staging at once load (or create) the table as often as one lease alone."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyiceberg.io.pyarrow
import pytest
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from devtools.analyst_reads import AnalystTable
from lease_core.model.sequence import TRIM_HORIZON
from sinks.batch_sink import BatchRange
from sinks.table.iceberg import IcebergSink, as_table_types, with_batch_columns
from sinks.table.iceberg_data_files import parquet_writer_options, single_partition_key
from tests.support.iceberg_tables import APPLICATION, IDENTITY, batch_of, position, rows, sink_on

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

    def content(self) -> tuple[Any, ...]:
        """What the file holds, whatever its pages' layout: its name, rows (read back), and entry but for
        its sizes (the file's and its columns')."""
        rows = pq.read_table(pa.BufferReader(self.data)).combine_chunks()
        return self.path, self.record_count, self.entry[:3] + self.entry[5:], rows


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
    sink: IcebergSink,
    batch: BatchRange,
    batch_rows: pa.Table,
    monkeypatch: pytest.MonkeyPatch,
    pyicebergs_settings: bool = False,
) -> tuple[list[WrittenFile], list[WrittenFile]]:
    """The data files `stage` wrote for the batch (as its manifest lists them, and their bytes), and
    what pyiceberg's own path writes for the same rows under the same names, in the table as staged:
    with the sink's Arrow settings (`parquet_writer_options`: the page row limit as a page's) unless
    `pyicebergs_settings`."""
    staged = sink.stage(batch, batch_rows, "a")
    table = sink.table()
    assert table is not None
    assert staged.token is not None
    receipt = sink.read_receipt(staged.token)
    ours = written(table, sink.staged_data_files(table, receipt))
    typed = as_table_types(with_batch_columns(batch_rows, batch), table.schema())
    with monkeypatch.context() as patch:
        if not pyicebergs_settings:
            patch.setattr(pyiceberg.io.pyarrow, "_get_parquet_writer_kwargs", parquet_writer_options)
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
    "one day, 3.6 MiB": rows(1, 5000, approximate_arrival_timestamp=arrivals(5000), data=payloads(5000)),
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
def test_a_staged_batchs_data_files_are_pyicebergs_with_the_same_entries_and_rows(
    iceberg_catalog, batch_rows, monkeypatch
):
    """pyiceberg's writer given the sink's Arrow settings writes the same files: byte for byte when
    the batch comes in one chunk (pyiceberg writes a partition's rows in one); in several, the sink
    writes them as they come, as the Parquet sink does, and only the pages' layout differs."""
    sink = sink_on(iceberg_catalog)

    ours, pyicebergs = staged_and_pyicebergs(
        sink, batch_of(TRIM_HORIZON, 1, batch_rows.num_rows), batch_rows, monkeypatch
    )

    assert [file.content() for file in ours] == [file.content() for file in pyicebergs]
    if all(column.num_chunks == 1 for column in batch_rows.columns):
        assert ours == pyicebergs
    assert sum(file.record_count for file in ours) == batch_rows.num_rows


@pytest.mark.parametrize("batch_rows", BATCHES.values(), ids=BATCHES.keys())
def test_pyicebergs_own_settings_write_the_same_rows_with_the_same_statistics(iceberg_catalog, batch_rows, monkeypatch):
    """Only the pages differ from what pyiceberg writes with its own settings (the page row limit as
    Arrow's write batch size): the files' names, rows, field ids, partitions, counts and bounds are the same."""
    sink = sink_on(iceberg_catalog)

    ours, pyicebergs = staged_and_pyicebergs(
        sink, batch_of(TRIM_HORIZON, 1, batch_rows.num_rows), batch_rows, monkeypatch, pyicebergs_settings=True
    )

    assert [file.content() for file in ours] == [file.content() for file in pyicebergs]
    table = sink.table()
    assert [field_ids(table, file.path) for file in ours] == [field_ids(table, file.path) for file in pyicebergs]


def test_the_writers_settings_are_pyicebergs_for_the_table_but_the_page_row_limit_which_limits_a_pages_rows():
    """`write.parquet.page-row-limit` is the most rows a page holds (as Iceberg's Java writer has it),
    given to Arrow as such; every other setting is pyiceberg's for the table's properties."""
    defaults = pyiceberg.io.pyarrow._get_parquet_writer_kwargs({})
    assert parquet_writer_options({}) == {
        **{key: value for key, value in defaults.items() if key != "write_batch_size"},
        "max_rows_per_page": 20_000,
    }
    properties = {
        "write.parquet.page-row-limit": "5000",
        "write.parquet.compression-codec": "snappy",
        "write.parquet.dict-size-bytes": "1048576",
    }
    options = parquet_writer_options(properties)
    assert options["max_rows_per_page"] == 5000
    assert "write_batch_size" not in options
    assert (options["compression"], options["dictionary_pagesize_limit"]) == ("snappy", 1 << 20)


def test_a_batch_of_several_mib_lands_whole_for_pyiceberg_and_for_duckdb(iceberg_catalog):
    """The files the sink writes are read back by pyiceberg's scan and by DuckDB (an analyst's reader,
    not pyiceberg) with every row and payload as staged, and their manifest entries have the columns'
    statistics."""
    sink = sink_on(iceberg_catalog)
    batch_rows = BATCHES["one day, 3.6 MiB in chunks"]
    batch = batch_of(TRIM_HORIZON, 1, batch_rows.num_rows)
    record = sink.commit_record(None, sink.stage(batch, batch_rows, "a"))
    sink.publish_round({batch.lease_key: record}, IDENTITY)
    table = sink.table(refresh=True)

    scanned = table.scan(selected_fields=("sequence_number", "data")).to_arrow().sort_by("sequence_number")
    read = AnalystTable.iceberg(table.metadata_location).rows(("sequence_number", "data")).sort_by("sequence_number")
    expected = batch_rows.select(["sequence_number", "data"]).sort_by("sequence_number")
    assert scanned.to_pylist() == read.to_pylist() == expected.to_pylist()
    (data_file,) = [task.file for task in table.scan().plan_files()]
    names = {field.field_id: field.name for field in table.schema().fields}
    assert {names[field_id] for field_id in data_file.lower_bounds} == set(names.values()) - {"explicit_hash_key"}
    assert {names[field_id] for field_id in data_file.value_counts} == set(names.values())


def test_the_files_stay_pyicebergs_after_a_new_column_and_each_partition_spec_change(iceberg_catalog, monkeypatch):
    sink = sink_on(iceberg_catalog)
    first = rows(1, 20, approximate_arrival_timestamp=arrivals(20))
    ours, pyicebergs = staged_and_pyicebergs(sink, batch_of(TRIM_HORIZON, 1, 20), first, monkeypatch)
    assert ours == pyicebergs

    # A transform adds a column: the sink evolves the schema, and the next files carry the column's id.
    amounts = pa.array([n / 2 for n in range(20)], pa.float64())
    second = rows(21, 20, approximate_arrival_timestamp=arrivals(20), amount=amounts)
    ours, pyicebergs = staged_and_pyicebergs(sink, batch_of(position(20), 21, 20), second, monkeypatch)
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
            sink, batch_of(position(first_number - 1), first_number, 20), batch_rows, monkeypatch
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
