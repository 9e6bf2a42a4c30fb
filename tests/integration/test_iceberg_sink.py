"""The Iceberg sink on a real pyiceberg SQL catalog (a SQLite file) and a local warehouse: batches staged
by slots become visible in one table commit per round, exactly once whoever publishes, and the table
records what it holds."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitStateUnknownException

from lease_core.model.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from spark_jobs.errors import SinkError
from spark_jobs.sinks.batch_sink import BatchRange, RoundIdentity, Visibility
from spark_jobs.sinks.iceberg import (
    SUMMARY_APPLICATION,
    SUMMARY_COMMIT_ID,
    SUMMARY_POSITIONS,
    SUMMARY_RANGES,
    SUMMARY_ROUND,
    SUMMARY_STREAMS,
    IcebergSink,
    parse_table_uri,
)

APPLICATION = "orders-app"
URI = "iceberg://lake/kinesis.orders"
STREAM = "orders"
STREAM_ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/orders"
CREATED = 1_764_000_000
ARRIVAL = datetime(2026, 11, 26, 23, 59, 59, tzinfo=UTC)
IDENTITY = RoundIdentity(APPLICATION, 7, {STREAM: (STREAM_ARN, CREATED)})


def catalog_properties(tmp_path: Path) -> dict[str, str]:
    return {"uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


class FaultyCatalog(SqlCatalog):
    """A SQL catalog that runs `before_commit` before each table commit, and can lose a commit's answer."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        self.before_commit: Callable[[], None] | None = None
        self.lose_answers = 0  # commits that land, then answer CommitStateUnknownException
        self.fail_unknown = 0  # commits that do not land, and answer CommitStateUnknownException
        self.commits = 0

    def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
        hook, self.before_commit = self.before_commit, None
        if hook is not None:
            hook()
        if self.fail_unknown:
            self.fail_unknown -= 1
            raise CommitStateUnknownException("the gateway timed out")
        response = super().commit_table(table, requirements, updates)
        self.commits += 1
        if self.lose_answers:
            self.lose_answers -= 1
            raise CommitStateUnknownException("the answer was lost")
        return response


@pytest.fixture
def catalog(tmp_path: Path) -> FaultyCatalog:
    catalog = FaultyCatalog("lake", **catalog_properties(tmp_path))
    catalog.create_namespace("kinesis")
    return catalog


def sink_on(catalog: FaultyCatalog, application: str = APPLICATION) -> IcebergSink:
    return IcebergSink(URI, application, catalog=catalog)


def position(number: int) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(number))


def rows(first: int, count: int, shard: str = "shardId-000000000001", **extra: pa.Array) -> pa.Table:
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
        "stream_name": pa.array([STREAM] * count, pa.string()),
        "shard_id": pa.array([shard] * count, pa.string()),
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
    staged = sink.stage(batch, rows(first, count, batch.shard_id), attempt)
    committed = sink.commit_record(record, staged)
    assert committed is not None
    return committed


def table_sequence_numbers(sink: IcebergSink) -> list[str]:
    table = sink.table(refresh=True)
    assert table is not None
    return sorted(table.scan().to_arrow().column("sequence_number").to_pylist(), key=int)


def test_a_rounds_batches_become_visible_in_one_commit_that_names_what_it_adds(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 100, 10)
    record = land(sink, record, position(109), 110, 5)
    assert sink.make_visible(record) is Visibility.AT_ROUND_END
    assert len(sink.awaiting_visibility(record)) == 2
    assert table_sequence_numbers(sink) == []

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 2)
    assert table_sequence_numbers(sink) == [str(n) for n in range(100, 115)]
    assert sink.awaiting_visibility(record) == ()
    assert sink.make_visible(record) is Visibility.VISIBLE
    table = sink.table(refresh=True)
    summary = table.current_snapshot().summary
    assert summary[SUMMARY_APPLICATION] == APPLICATION
    assert summary[SUMMARY_ROUND] == "7"
    assert summary[SUMMARY_STREAMS] == f"{STREAM} {STREAM_ARN} created {CREATED}"
    assert summary[SUMMARY_RANGES] == "shardId-000000000001 100-0..109-0; shardId-000000000001 110-0..114-0"
    assert Path(summary[SUMMARY_POSITIONS].removeprefix("file://")).is_file()
    assert published.snapshot_id == table.current_snapshot().snapshot_id


def test_a_missing_table_is_created_partitioned_by_day_of_arrival(catalog):
    sink = sink_on(catalog)
    land(sink, None, TRIM_HORIZON, 1, 3)
    table = sink.table()
    assert [(field.name, str(field.transform)) for field in table.spec().fields] == [("arrival_day", "day")]
    assert table.schema().find_field("stream_name") and table.schema().find_field("shard_id")


def test_publishing_again_after_a_commit_adds_nothing(catalog):
    """A driver retried after its commit, or the next round finding the records not yet pruned."""
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    again = sink_on(catalog).publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (again.commits, again.batches_published, again.batches_already_visible) == (0, 0, 1)
    assert len(table_sequence_numbers(sink)) == 10


def test_a_publisher_that_loses_the_race_to_another_checks_again_and_adds_nothing(catalog):
    """Two overlapping jobs publish the same records: the second's check ran before the first's commit.
    pyiceberg's own retry would rebase the second append past its check and land the rows twice."""
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    records = {"shardId-000000000001": record}
    first_job = sink_on(catalog)
    catalog.before_commit = lambda: first_job.publish_round(records, IDENTITY)

    second = sink.publish_round(records, IDENTITY)

    assert (second.commits, second.batches_published, second.batches_already_visible) == (0, 0, 1)
    assert len(table_sequence_numbers(sink)) == 10


def test_another_writers_commit_in_between_is_retried_with_the_check_run_again(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    table = sink.table()

    def users_append() -> None:
        table.append(rows(500, 2).cast(table.schema().as_arrow()), snapshot_properties={"note": "a user's own rows"})

    catalog.before_commit = users_append
    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 1)
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 11)] + ["500", "501"]


def test_a_commit_whose_answer_was_lost_is_found_and_not_made_again(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    catalog.lose_answers = 1

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 1)
    assert catalog.commits == 1
    assert len(table_sequence_numbers(sink)) == 10
    table = sink.table(refresh=True)
    assert table.current_snapshot().snapshot_id == published.snapshot_id
    assert table.current_snapshot().summary[SUMMARY_COMMIT_ID]


def test_a_commit_whose_answer_was_lost_and_that_did_not_land_is_made_again(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    catalog.fail_unknown = 1

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (published.commits, catalog.commits) == (1, 1)
    assert len(table_sequence_numbers(sink)) == 10


def test_a_batch_staged_by_an_attempt_that_never_committed_is_never_visible(catalog):
    sink = sink_on(catalog)
    zombie = sink.stage(batch_of(TRIM_HORIZON, 1, 10), rows(1, 10), "zombie")
    record = land(sink, None, TRIM_HORIZON, 1, 10, attempt="newer")
    assert zombie.token not in record

    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert len(table_sequence_numbers(sink)) == 10


def test_a_batch_whose_receipt_is_gone_is_reported_missing_and_the_rest_lands(catalog, tmp_path):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    record = land(sink, record, position(10), 11, 5)
    receipts = sorted((tmp_path / "warehouse").rglob("kinesis-staged/*.json"), key=os.path.getmtime)
    receipts[0].unlink()

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert published.batches_published == 1
    assert published.missing_batches == ("shardId-000000000001 up to 10",)
    assert table_sequence_numbers(sink) == [str(n) for n in range(11, 16)]


def test_a_lease_record_keeps_only_the_batches_the_table_does_not_hold(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    record = land(sink, record, position(10), 11, 5)

    assert len(sink.awaiting_visibility(record)) == 1
    assert '"10"' not in record and '"15"' in record


def test_the_application_finds_its_positions_beneath_other_writers_snapshots(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    table = sink.table(refresh=True)
    table.append(rows(500, 2).cast(table.schema().as_arrow()))

    assert sink_on(catalog).awaiting_visibility(record) == ()
    assert sink_on(catalog, "another-app").awaiting_visibility(record) != ()


def test_a_transform_that_adds_a_column_evolves_the_table(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 3)
    batch = batch_of(position(3), 4, 2)
    extra = rows(4, 2, amount=pa.array([1.5, 2.5], pa.float64()))
    record = sink.commit_record(record, sink.stage(batch, extra, "a"))
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    landed = sink.table(refresh=True).scan().to_arrow()
    assert sorted(landed.column("amount").to_pylist(), key=lambda v: (v is not None, v)) == [None, None, None, 1.5, 2.5]


def test_a_column_of_a_conflicting_type_is_refused_before_anything_is_written(catalog, tmp_path):
    sink = sink_on(catalog)
    land(sink, None, TRIM_HORIZON, 1, 3)
    files_before = sorted((tmp_path / "warehouse").rglob("*"))
    conflicting = rows(4, 2, partition_key=pa.array([1, 2], pa.int64()))

    with pytest.raises(SinkError, match=r"column 'partition_key' is long in the batch but string in the table"):
        sink.stage(batch_of(position(3), 4, 2), conflicting, "a")
    assert sorted((tmp_path / "warehouse").rglob("*")) == files_before


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        ("iceberg://lake", "a catalog name, then a namespace and a table"),
        ("iceberg://lake/orders", "a catalog name, then a namespace and a table"),
        ("iceberg:///kinesis.orders", "a catalog name, then a namespace and a table"),
        ("iceberg://lake/kinesis.or ders", "'or ders' is not a catalog, namespace or table name"),
        ("s3://bucket/path", "is not of the form iceberg://CATALOG/NAMESPACE.TABLE"),
    ],
    ids=["no table", "no namespace", "no catalog", "a space", "another scheme"],
)
def test_a_malformed_uri_is_refused_naming_what_is_wrong(uri, complaint):
    with pytest.raises(SinkError, match=complaint):
        parse_table_uri(uri)


def test_a_nested_namespace_is_read_from_the_uri():
    address = parse_table_uri("iceberg://glue_prod/analytics.raw.orders")
    assert (address.catalog, address.namespace, address.table) == ("glue_prod", ("analytics", "raw"), "orders")


def test_an_unconfigured_catalog_is_refused_naming_the_variables_to_set(monkeypatch):
    monkeypatch.delenv("PYICEBERG_CATALOG__NOWHERE__TYPE", raising=False)
    monkeypatch.setenv("PYICEBERG_HOME", "/nonexistent")
    with pytest.raises(SinkError, match=r"catalog 'nowhere' is not configured: set PYICEBERG_CATALOG__NOWHERE__TYPE"):
        IcebergSink("iceberg://nowhere/kinesis.orders", APPLICATION).check_writable()


def test_a_dynamodb_catalog_is_refused_because_pyiceberg_cannot_commit_to_it(monkeypatch):
    monkeypatch.setenv("PYICEBERG_CATALOG__DDB__TYPE", "dynamodb")
    with pytest.raises(SinkError, match=r"catalog 'ddb' is of type 'dynamodb', which pyiceberg cannot commit to"):
        IcebergSink("iceberg://ddb/kinesis.orders", APPLICATION).check_writable()


def test_a_catalog_configured_by_environment_variables_is_used(monkeypatch, tmp_path):
    for key, value in catalog_properties(tmp_path).items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__ENVLAKE__{key.upper()}", value)
    monkeypatch.setenv("PYICEBERG_CATALOG__ENVLAKE__TYPE", "sql")
    sink = IcebergSink("iceberg://envlake/kinesis.orders", APPLICATION)
    sink.catalog.create_namespace("kinesis")
    sink.check_writable()
    record = land(sink, None, TRIM_HORIZON, 1, 2)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    assert len(table_sequence_numbers(sink)) == 2


def test_a_missing_namespace_is_refused_before_anything_is_written(catalog):
    sink = IcebergSink("iceberg://lake/elsewhere.orders", APPLICATION, catalog=catalog)
    with pytest.raises(SinkError, match=r"namespace 'elsewhere' does not exist in catalog 'lake'"):
        sink.check_writable()


def test_batches_staged_before_the_partition_spec_changed_land_in_the_new_spec(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    table = sink.table()
    with table.update_spec() as update:
        update.add_identity("shard_id")

    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    table = sink.table(refresh=True)
    assert len(table.scan(row_filter="shard_id == 'shardId-000000000001'").to_arrow()) == 10
    specs = {task.file.spec_id for task in table.scan().plan_files()}
    assert specs == {table.metadata.default_spec_id}


def test_positions_outlive_the_expiry_of_the_applications_snapshots_by_another_tool(catalog):
    sink = sink_on(catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    table = sink.table(refresh=True)
    table.append(rows(500, 2).cast(table.schema().as_arrow()))
    table = sink.table(refresh=True)
    ours = [snapshot.snapshot_id for snapshot in table.snapshots() if snapshot.summary.get(SUMMARY_COMMIT_ID)]
    table.maintenance.expire_snapshots().by_ids(ours).commit()

    assert sink_on(catalog).awaiting_visibility(record) == ()
    assert sink_on(catalog).publish_round({"shardId-000000000001": record}, IDENTITY).batches_published == 0
    assert len(table_sequence_numbers(sink)) == 12


def test_batches_a_rollback_took_out_of_the_table_are_published_again(catalog):
    """Their ranges are committed on the leases: the table must hold them."""
    sink = sink_on(catalog)
    first = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": first}, IDENTITY)
    before = sink.table(refresh=True).current_snapshot().snapshot_id
    second = land(sink, first, position(10), 11, 5)
    sink.publish_round({"shardId-000000000001": second}, IDENTITY)
    table = sink.table(refresh=True)
    table.manage_snapshots().rollback_to_snapshot(before).commit()

    again = sink_on(catalog).publish_round({"shardId-000000000001": second}, IDENTITY)

    assert (again.batches_published, again.batches_already_visible) == (1, 0)
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 16)]
