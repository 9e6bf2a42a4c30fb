"""Iceberg tables for tests: pyiceberg's SQL catalog on a SQLite file with a local warehouse, wrapped
to inject commit faults, and the batches a slot hands to the Iceberg sink."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.table import Table

from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from sinks.batch_sink import BatchRange, RoundIdentity
from sinks.table.iceberg import IcebergSink, with_batch_columns
from tests.support.pipeline import ConsumerPipeline, pipeline_on_new_stream

APPLICATION = "orders-app"
URI = "iceberg://lake/kinesis.orders"
STREAM = "orders"
STREAM_ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/orders"
CREATED = 1_764_000_000
ARRIVAL = datetime(2026, 11, 26, 23, 59, 59, tzinfo=UTC)
IDENTITY = RoundIdentity(APPLICATION, 7, {STREAM: (STREAM_ARN, CREATED)})


def catalog_properties(tmp_path: Path) -> dict[str, str]:
    return {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def catalog_environment(catalog: str, properties: Mapping[str, str]) -> dict[str, str]:
    """The catalog's properties as pyiceberg's environment variables: `.` in a name is `__`, `-` is `_`."""
    return {
        f"PYICEBERG_CATALOG__{catalog.upper()}__{key.upper().replace('.', '__').replace('-', '_')}": value
        for key, value in properties.items()
    }


def glue_catalog_properties(glue_endpoint: str, s3_endpoint: str, warehouse: str) -> dict[str, str]:
    """AWS Glue with its tables in S3 at `warehouse`, both at an emulator's endpoints, with dummy credentials."""
    credentials = {"access-key-id": "testing", "secret-access-key": "testing", "region": "us-east-1"}
    return {
        "type": "glue",
        "glue.endpoint": glue_endpoint,
        **{f"glue.{key}": value for key, value in credentials.items()},
        "s3.endpoint": s3_endpoint,
        **{f"s3.{key}": value for key, value in credentials.items()},
        "warehouse": warehouse,
    }


class FaultyCatalog(SqlCatalog):
    """A SQL catalog that runs `before_commit` before each table commit, can lose a commit's answer,
    and can refuse every commit (`refuse_commits`: the catalog cannot be reached to commit)."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        self.before_commit: Callable[[], None] | None = None
        self.lose_answers = 0  # commits that land, then answer CommitStateUnknownException
        self.fail_unknown = 0  # commits that do not land, and answer CommitStateUnknownException
        self.refuse_commits = False
        self.commits = 0

    def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
        hook, self.before_commit = self.before_commit, None
        if hook is not None:
            hook()
        if self.refuse_commits:
            raise ConnectionRefusedError("injected: the catalog cannot be reached to commit")
        if self.fail_unknown:
            self.fail_unknown -= 1
            raise CommitStateUnknownException("the gateway timed out")
        response = super().commit_table(table, requirements, updates)
        self.commits += 1
        if self.lose_answers:
            self.lose_answers -= 1
            raise CommitStateUnknownException("the answer was lost")
        return response


def faulty_catalog(tmp_path: Path) -> FaultyCatalog:
    """The catalog on `tmp_path`, its namespace created when missing: another process's view of it."""
    catalog = FaultyCatalog("lake", **catalog_properties(tmp_path))
    catalog.create_namespace_if_not_exists("kinesis")
    return catalog


@pytest.fixture
def iceberg_catalog(tmp_path: Path) -> FaultyCatalog:
    return faulty_catalog(tmp_path)


def sink_on(catalog: FaultyCatalog, application: str = APPLICATION) -> IcebergSink:
    return IcebergSink(URI, application, catalog=catalog)


def position(number: int) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(number))


def rows(first: int, count: int, **extra: pa.Array) -> pa.Table:
    """Records numbered first..first+count-1, as the consumer hands a batch to the sink."""
    numbers = range(first, first + count)
    columns: dict[str, Any] = {
        "sequence_number": pa.array([str(n) for n in numbers], pa.string()),
        "sub_sequence_number": pa.array([0] * count, pa.int64()),
        "partition_key": pa.array([f"key-{n}" for n in numbers], pa.string()),
        "approximate_arrival_timestamp": pa.array(
            [ARRIVAL + timedelta(seconds=n - first) for n in numbers], pa.timestamp("ms", tz="UTC")
        ),
        "data": pa.array([f"payload {n}".encode() for n in numbers], pa.binary()),
    }
    columns.update(extra)
    return pa.table(columns)


def batch_of(start: ExtendedSequenceNumber, first: int, count: int, shard: str = "shardId-000000000001") -> BatchRange:
    return BatchRange(shard, STREAM, shard, start, position(first), position(first + count - 1))


def land(
    sink: IcebergSink, record: str | None, start: ExtendedSequenceNumber, first: int, count: int, attempt: str = "a"
) -> str:
    """Stage a batch and return the lease's record after its commit."""
    batch = batch_of(start, first, count)
    staged = sink.stage(batch, rows(first, count), attempt)
    committed = sink.commit_record(record, staged)
    assert committed is not None
    return committed


def table_sequence_numbers(sink: IcebergSink) -> list[str]:
    table = sink.table(refresh=True)
    assert table is not None
    return sorted(table.scan().to_arrow().column("sequence_number").to_pylist(), key=int)


def users_rows(table: Table, first: int, count: int) -> pa.Table:
    """Rows another writer of the table appends (a user's own), in the table's columns and types."""
    own = with_batch_columns(rows(first, count), batch_of(TRIM_HORIZON, first, count, "users-own"))
    schema = table.schema().as_arrow()
    return own.select(schema.names).cast(schema)


PIPELINE_CATALOG = "lakehouse"


@pytest.fixture
def table_pipeline(unique_name, kinesis_endpoint, moto_endpoint, tmp_path: Path, monkeypatch) -> ConsumerPipeline:
    """A consumer application on a new 4-shard stream landing in an Iceberg table of a SQL catalog on
    SQLite, configured by environment variables as a user configures pyiceberg."""
    properties = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}
    for name, value in catalog_environment(PIPELINE_CATALOG, properties).items():
        monkeypatch.setenv(name, value)
    SqlCatalog(PIPELINE_CATALOG, **properties).create_namespace("kinesis")
    pipeline = pipeline_on_new_stream(
        unique_name,
        4,
        kinesis_endpoint,
        moto_endpoint,
        tmp_path,
        initial_position_in_stream="TRIM_HORIZON",
        failover_time_millis=6000,
    )
    pipeline.output_uri = f"iceberg://{PIPELINE_CATALOG}/kinesis.{unique_name.replace('-', '_').replace('.', '_')}"
    return pipeline
