"""The analyst's reader (`devtools.analyst_reads`) on real tables the sinks land: DuckDB sees every row
an Iceberg or a Delta table (in a folder, on S3) holds, each as often as it is there, as the library
that wrote the table sees them, also after that library deleted rows and rewrote the files; its
extensions are the wheels' own, and a table it cannot read is an error that names it."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import boto3
import pytest
from pyiceberg.expressions import EqualTo

from devtools.analyst_reads import (
    EXTENSION_PACKAGES,
    IDENTITY_COLUMNS,
    AnalystReadError,
    AnalystTable,
    Identity,
    analyst_database,
    extension_directory,
)
from lease_core.model.sequence import TRIM_HORIZON
from sinks.batch_sink import BatchSink
from sinks.table.delta import DeltaSink
from tests.support.iceberg_tables import (
    APPLICATION,
    IDENTITY,
    STREAM,
    batch_of,
    faulty_catalog,
    position,
    rows,
    sink_on,
)

SHARDS = ("shardId-000000000001", "shardId-000000000002")


def landed(sink: BatchSink, batches: int = 3, size: int = 4) -> list[Identity]:
    """`batches` batches of `size` records on each of two shards, committed on their leases and made
    visible in one round; the identities of the records, in the reader's order."""
    records = {}
    for shard in SHARDS:
        record, start = None, TRIM_HORIZON
        for first in range(1, batches * size, size):
            record = sink.commit_record(record, sink.stage(batch_of(start, first, size, shard), rows(first, size), "a"))
            start = position(first + size - 1)
        assert record is not None
        records[shard] = record
    assert sink.publish_round(records, IDENTITY).batches_published == batches * len(SHARDS)
    return [(STREAM, shard, str(number), 0) for shard in SHARDS for number in range(1, batches * size + 1)]


def without(identities: list[Identity], shard: str) -> list[Identity]:
    return [identity for identity in identities if identity[1] != shard]


def test_duckdb_reads_an_iceberg_tables_rows_as_pyiceberg_does_through_a_delete_a_rewrite_and_a_duplicate(
    tmp_path: Path,
):
    sink = sink_on(faulty_catalog(tmp_path))
    expected = landed(sink)

    def read_alike() -> list[Identity]:
        table = sink.table(refresh=True)
        assert table is not None
        read = AnalystTable.iceberg(table.metadata_location)
        written = table.scan(selected_fields=IDENTITY_COLUMNS).to_arrow()
        assert read.count() == written.num_rows
        identities = read.identities()
        assert sorted(identities) == sorted(zip(*(written.column(name).to_pylist() for name in IDENTITY_COLUMNS)))
        return identities

    assert read_alike() == expected
    first_version = AnalystTable.iceberg(sink.table(refresh=True).metadata_location)

    sink.table(refresh=True).delete(EqualTo("shard_id", SHARDS[0]))
    assert read_alike() == without(expected, SHARDS[0])
    assert first_version.identities() == expected, "a metadata file is the table as it was then"

    table = sink.table(refresh=True)
    table.overwrite(table.scan().to_arrow())  # every data file rewritten into one, as a compaction does
    assert read_alike() == without(expected, SHARDS[0])

    table = sink.table(refresh=True)
    table.append(table.scan().to_arrow())  # another writer lands the same records again
    assert read_alike() == sorted(without(expected, SHARDS[0]) * 2, key=lambda row: int(row[2]))


def assert_delta_read_alike(sink: DeltaSink, expected: list[Identity], s3_endpoint_url: str | None = None) -> None:
    """DuckDB reads `expected` from the table, as many rows as delta-rs' file list holds."""
    read = AnalystTable.delta(sink.location, s3_endpoint_url)
    written = sink.visible_rows(IDENTITY_COLUMNS)
    assert written is not None
    assert read.identities() == expected
    assert read.count() == written.num_rows == len(expected)


def rewrite_and_forget(sink: DeltaSink) -> None:
    """Compact the table's files, delete the files no version needs, checkpoint the log (delta-rs)."""
    table = sink.table()
    assert table is not None
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    table.create_checkpoint()


def test_duckdb_reads_a_delta_tables_rows_as_delta_rs_does_through_a_delete_a_compaction_and_a_duplicate(
    tmp_path: Path,
):
    uri = f"delta:{tmp_path / 'orders'}"
    sink = DeltaSink(uri, APPLICATION)
    expected = landed(sink)
    assert_delta_read_alike(sink, expected)

    table = sink.table()
    assert table is not None
    table.delete(f"shard_id = '{SHARDS[0]}'")
    assert_delta_read_alike(sink, without(expected, SHARDS[0]))

    rewrite_and_forget(sink)
    assert_delta_read_alike(sink, without(expected, SHARDS[0]))

    landed(DeltaSink(uri, "another-app"))  # another application lands the same records again
    assert_delta_read_alike(
        sink, sorted(expected + without(expected, SHARDS[0]), key=lambda row: (row[1], int(row[2])))
    )


def test_duckdb_reads_a_delta_table_on_s3_through_an_s3_secret_for_the_endpoint(moto_endpoint: str):
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    sink = DeltaSink(f"delta:s3://{bucket}/tables/orders", APPLICATION, s3_endpoint_url=moto_endpoint)
    expected = landed(sink)
    assert_delta_read_alike(sink, expected, moto_endpoint)

    table = sink.table()
    assert table is not None
    table.delete(f"shard_id = '{SHARDS[1]}'")
    rewrite_and_forget(sink)
    assert_delta_read_alike(sink, without(expected, SHARDS[1]), moto_endpoint)


def test_duckdb_loads_its_extensions_from_the_wheels_and_may_install_or_autoload_none():
    database = analyst_database()
    loaded = database.sql(
        "SELECT extension_name, install_path FROM duckdb_extensions() WHERE loaded AND install_path <> '(BUILT-IN)'"
    ).fetchall()
    folder = extension_directory(tuple(EXTENSION_PACKAGES))
    assert {name for name, _ in loaded} == set(EXTENSION_PACKAGES)
    assert all(Path(path).is_relative_to(folder) for _, path in loaded), loaded
    settings = database.sql(
        "SELECT current_setting('autoinstall_known_extensions'), current_setting('autoload_known_extensions')"
    ).fetchone()
    assert settings == (False, False)


@pytest.mark.parametrize(
    "table",
    [
        pytest.param(lambda folder: AnalystTable.delta(str(folder)), id="delta-folder-without-a-log"),
        pytest.param(
            lambda folder: AnalystTable.iceberg(f"file://{folder}/v1.metadata.json"), id="iceberg-metadata-gone"
        ),
    ],
)
def test_a_table_duckdb_cannot_read_is_an_error_naming_it(tmp_path: Path, table):
    unreadable = table(tmp_path)
    with pytest.raises(AnalystReadError, match=re.escape(f"DuckDB cannot read {unreadable.location} ")):
        unreadable.count()
