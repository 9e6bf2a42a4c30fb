"""The Iceberg sink on a real pyiceberg SQL catalog (a SQLite file) and a local warehouse: batches staged
by slots become visible in one table commit per round, exactly once whoever publishes, and the table
records what it holds."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from lease_core.model.sequence import TRIM_HORIZON
from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.batch_sink import RoundIdentity, Visibility
from sinks.errors import SinkError
from sinks.record_columns import RECORD_SCHEMA, records_table
from sinks.table.committer import (
    SUMMARY_APPLICATION,
    SUMMARY_COMMIT_ID,
    SUMMARY_POSITIONS,
    SUMMARY_RANGES,
    SUMMARY_ROUND,
    SUMMARY_STREAMS,
)
from sinks.table.iceberg import (
    IcebergSink,
    parse_table_uri,
)
from spark_jobs.decode import load_decoder
from spark_jobs.transform import batch_columns
from tests.support.iceberg_tables import (
    APPLICATION,
    CREATED,
    IDENTITY,
    STREAM,
    STREAM_ARN,
    URI,
    batch_of,
    catalog_properties,
    land,
    position,
    rows,
    sink_on,
    table_sequence_numbers,
    users_rows,
)


def test_a_rounds_batches_become_visible_in_one_commit_that_names_what_it_adds(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
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


def test_a_missing_table_is_created_partitioned_by_day_of_arrival(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    land(sink, None, TRIM_HORIZON, 1, 3)
    table = sink.table()
    assert [(field.name, str(field.transform)) for field in table.spec().fields] == [("arrival_day", "day")]
    assert table.schema().find_field("stream_name") and table.schema().find_field("shard_id")


def test_publishing_again_after_a_commit_adds_nothing(iceberg_catalog):
    """A driver retried after its commit, or the next round finding the records not yet pruned."""
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    again = sink_on(iceberg_catalog).publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (again.commits, again.batches_published, again.batches_already_visible) == (0, 0, 1)
    assert len(table_sequence_numbers(sink)) == 10


def test_a_publisher_that_loses_the_race_to_another_checks_again_and_adds_nothing(iceberg_catalog):
    """Two overlapping jobs publish the same records: the second's check ran before the first's commit.
    pyiceberg's own retry would rebase the second append past its check and land the rows twice."""
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    records = {"shardId-000000000001": record}
    first_job = sink_on(iceberg_catalog)
    iceberg_catalog.before_commit = lambda: first_job.publish_round(records, IDENTITY)

    second = sink.publish_round(records, IDENTITY)

    assert (second.commits, second.batches_published, second.batches_already_visible) == (0, 0, 1)
    assert len(table_sequence_numbers(sink)) == 10


def test_another_writers_commit_in_between_is_retried_with_the_check_run_again(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    table = sink.table()

    def users_append() -> None:
        table.append(users_rows(table, 500, 2), snapshot_properties={"note": "a user's own rows"})

    iceberg_catalog.before_commit = users_append
    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 1)
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 11)] + ["500", "501"]


def test_a_commit_whose_answer_was_lost_is_found_and_not_made_again(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    iceberg_catalog.lose_answers = 1

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 1)
    assert iceberg_catalog.commits == 1
    assert len(table_sequence_numbers(sink)) == 10
    table = sink.table(refresh=True)
    assert table.current_snapshot().snapshot_id == published.snapshot_id
    assert table.current_snapshot().summary[SUMMARY_COMMIT_ID]


def test_a_commit_whose_answer_was_lost_and_that_did_not_land_is_made_again(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    iceberg_catalog.fail_unknown = 1

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert (published.commits, iceberg_catalog.commits) == (1, 1)
    assert len(table_sequence_numbers(sink)) == 10


def test_a_batch_staged_by_an_attempt_that_never_committed_is_never_visible(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    zombie = sink.stage(batch_of(TRIM_HORIZON, 1, 10), rows(1, 10), "zombie")
    record = land(sink, None, TRIM_HORIZON, 1, 10, attempt="newer")
    assert zombie.token not in record

    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert len(table_sequence_numbers(sink)) == 10


def test_a_batch_whose_receipt_is_gone_is_reported_missing_and_the_rest_lands(iceberg_catalog, tmp_path):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    record = land(sink, record, position(10), 11, 5)
    receipts = sorted((tmp_path / "warehouse").rglob("kinesis-staged/*/*.json"), key=os.path.getmtime)
    receipts[0].unlink()

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert published.batches_published == 1
    assert published.missing_batches == ("shardId-000000000001: the batch up to 10",)
    assert table_sequence_numbers(sink) == [str(n) for n in range(11, 16)]


def test_a_lease_record_keeps_only_the_batches_the_table_does_not_hold(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    record = land(sink, record, position(10), 11, 5)

    assert len(sink.awaiting_visibility(record)) == 1
    assert '"10"' not in record and '"15"' in record


def test_a_stream_created_again_under_its_name_is_not_taken_for_the_one_the_table_holds(iceberg_catalog):
    """Single-stream lease keys are shard ids, the same in a stream deleted and created again: the
    new stream's batches of shardId-000000000001 up to sequence number 10 are not the old ones."""
    old = sink_on(iceberg_catalog)
    old.publish_round({"shardId-000000000001": land(old, None, TRIM_HORIZON, 1, 50)}, IDENTITY)
    again = {STREAM: (STREAM_ARN, CREATED + 86_400)}
    sink = IcebergSink(URI, APPLICATION, catalog=iceberg_catalog, streams=again)

    record = land(sink, None, TRIM_HORIZON, 1, 10)
    assert sink.make_visible(record) is Visibility.AT_ROUND_END and len(sink.awaiting_visibility(record)) == 1
    published = sink.publish_round({"shardId-000000000001": record}, RoundIdentity(APPLICATION, 8, again))

    assert published.batches_published == 1
    assert table_sequence_numbers(sink).count("1") == 2, "the new stream's first record is in the table as well"
    assert sink_on(iceberg_catalog).awaiting_visibility(record) == (), "the table now holds the new stream's"


def test_the_application_finds_its_positions_beneath_other_writers_snapshots(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    table = sink.table(refresh=True)
    table.append(users_rows(table, 500, 2))

    assert sink_on(iceberg_catalog).awaiting_visibility(record) == ()
    assert "shardId-000000000001" in sink_on(iceberg_catalog).positions_in(table)
    assert sink_on(iceberg_catalog, "another-app").positions_in(table) == {}, "each application has its own map"


def test_a_transform_that_adds_a_column_evolves_the_table(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 3)
    batch = batch_of(position(3), 4, 2)
    extra = rows(4, 2, amount=pa.array([1.5, 2.5], pa.float64()))
    record = sink.commit_record(record, sink.stage(batch, extra, "a"))
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    landed = sink.table(refresh=True).scan().to_arrow()
    assert sorted(landed.column("amount").to_pylist(), key=lambda v: (v is not None, v)) == [None, None, None, 1.5, 2.5]


def test_nested_columns_a_json_decoder_makes_land_batch_after_batch(iceberg_catalog):
    """A list of structs and a map, as a decoder of nested JSON returns them: the first batch creates
    the table, the next ones (with ints where the table has longs) land in it by the columns' structure."""
    items = pa.list_(pa.struct([("sku", pa.string()), ("quantity", pa.int64())]))
    tags = pa.map_(pa.string(), pa.string())
    sink = sink_on(iceberg_catalog)
    first = rows(
        1, 2, items=pa.array([[{"sku": "a", "quantity": 1}], []], items), tags=pa.array([[("k", "v")], []], tags)
    )
    record = sink.commit_record(None, sink.stage(batch_of(TRIM_HORIZON, 1, 2), first, "a"))
    narrower = pa.list_(pa.struct([("sku", pa.string()), ("quantity", pa.int32())]))
    later = rows(3, 1, items=pa.array([[{"sku": "b", "quantity": 2}, {"sku": "c", "quantity": 3}]], narrower))
    record = sink.commit_record(record, sink_on(iceberg_catalog).stage(batch_of(position(2), 3, 1), later, "a"))
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    landed = sorted(sink.table(refresh=True).scan().to_arrow().to_pylist(), key=lambda row: int(row["sequence_number"]))
    assert [row["items"] for row in landed] == [
        [{"sku": "a", "quantity": 1}],
        [],
        [{"sku": "b", "quantity": 2}, {"sku": "c", "quantity": 3}],
    ]
    assert [row["tags"] for row in landed] == [[("k", "v")], [], None]


def test_a_table_a_rounds_report_creates_before_a_decoded_batch_gets_the_decoders_columns_not_the_payloads(
    iceberg_catalog,
):
    decoder = load_decoder("tests.support.decoders:json_amounts")
    assert decoder is not None
    records = [
        KinesisRecord(str(n), 0, f"key-{n}", datetime(2026, 11, 26, tzinfo=UTC), b'{"amount": %d}' % n) for n in (1, 2)
    ]
    sink = sink_on(iceberg_catalog)

    sink.reports_root()  # the operator finds where the round's report goes before the round
    decoded = decoder.decode_batch(records, "orders", "shardId-000000000001")
    record = sink.commit_record(None, sink.stage(batch_of(TRIM_HORIZON, 1, 2), decoded.table, "a"))
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert sink.table(refresh=True).scan().to_arrow().column_names == [
        "stream_name",
        "shard_id",
        "sequence_number",
        "sub_sequence_number",
        "partition_key",
        "approximate_arrival_timestamp",
        "amount",
    ], "no `data` or `explicit_hash_key` that would be null in every row"


def test_a_table_a_rounds_report_creates_before_a_batch_of_raw_records_gets_their_payload_columns(iceberg_catalog):
    """A pipeline without a decoder stages the records' columns as they are read: `data` and the
    position columns are not nullable in Arrow, and the table adds them as optional columns."""
    records = [
        KinesisRecord(str(n), 0, f"key-{n}", datetime(2026, 11, 26, tzinfo=UTC), b"payload %d" % n) for n in (1, 2)
    ]
    sink = sink_on(iceberg_catalog)

    sink.reports_root()  # the operator finds where the round's report goes before the round
    record = sink.commit_record(None, sink.stage(batch_of(TRIM_HORIZON, 1, 2), records_table(records), "a"))
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    landed = sink.table(refresh=True).scan().to_arrow()
    assert landed.column_names == ["stream_name", "shard_id", *RECORD_SCHEMA.names]
    assert sorted(landed.column("data").to_pylist()) == [b"payload 1", b"payload 2"]
    assert not any(field.required for field in sink.table().schema().fields)


def test_a_nested_column_of_another_structure_is_refused_naming_it(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    items = pa.list_(pa.struct([("sku", pa.string())]))
    sink.stage(batch_of(TRIM_HORIZON, 1, 1), rows(1, 1, items=pa.array([[{"sku": "a"}]], items)), "a")
    other = pa.list_(pa.struct([("sku", pa.string()), ("price", pa.float64())]))

    with pytest.raises(SinkError, match=r"column 'items' is list<struct<.*price.*> in the batch but"):
        sink.stage(batch_of(position(1), 2, 1), rows(2, 1, items=pa.array([[{"sku": "b", "price": 1.0}]], other)), "a")


def test_a_column_of_a_conflicting_type_is_refused_before_anything_is_written(iceberg_catalog, tmp_path):
    sink = sink_on(iceberg_catalog)
    land(sink, None, TRIM_HORIZON, 1, 3)
    files_before = sorted((tmp_path / "warehouse").rglob("*"))
    conflicting = rows(4, 2, partition_key=pa.array([1, 2], pa.int64()))

    with pytest.raises(SinkError, match=r"column 'partition_key' is long in the batch but string in the table"):
        sink.stage(batch_of(position(3), 4, 2), conflicting, "a")
    assert sorted((tmp_path / "warehouse").rglob("*")) == files_before


def users_table(catalog, *fields: NestedField) -> None:
    """A table the user created for the pipeline, with columns of their choice."""
    catalog.create_table(("kinesis", "orders"), schema=Schema(*fields))


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        (
            (NestedField(1, "sequence_number", LongType(), required=False),),
            r"column 'sequence_number' is string in the batch but long in the table",
        ),
        (
            (NestedField(1, "customer_id", StringType(), required=True),),
            r"the table requires column 'customer_id' \(string\), which the batches do not have",
        ),
    ],
    ids=["a column of another type", "a required column the records lack"],
)
def test_a_table_that_cannot_hold_the_records_is_refused_before_any_lease_moves(iceberg_catalog, fields, complaint):
    users_table(iceberg_catalog, *fields)
    with pytest.raises(SinkError, match=complaint):
        sink_on(iceberg_catalog).check_writable(RECORD_SCHEMA)


def test_a_table_is_checked_against_what_the_transform_makes_of_the_records(iceberg_catalog):
    users_table(iceberg_catalog, NestedField(1, "amount", LongType(), required=False))

    def as_text(table: pa.Table) -> pa.Table:
        return table.append_column("amount", pa.array(["1"] * table.num_rows, pa.string()))

    with pytest.raises(SinkError, match=r"column 'amount' is string in the batch but long in the table"):
        sink_on(iceberg_catalog).check_writable(batch_columns("users.module:as_text", as_text))


def test_a_transform_that_cannot_take_a_batch_without_rows_leaves_the_check_to_its_first_batch(iceberg_catalog):
    users_table(iceberg_catalog, NestedField(1, "amount", LongType(), required=False))

    def first_row_only(table: pa.Table) -> pa.Table:
        return table.slice(0, 1).append_column("amount", pa.array([table.num_rows // table.num_rows], pa.int64()))

    columns = batch_columns("users.module:first_row_only", first_row_only)
    assert columns is None
    sink_on(iceberg_catalog).check_writable(columns)


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
        IcebergSink("iceberg://nowhere/kinesis.orders", APPLICATION).check_writable(RECORD_SCHEMA)


def test_a_dynamodb_catalog_is_refused_because_pyiceberg_cannot_commit_to_it(monkeypatch):
    monkeypatch.setenv("PYICEBERG_CATALOG__DDB__TYPE", "dynamodb")
    with pytest.raises(SinkError, match=r"catalog 'ddb' is of type 'dynamodb', which pyiceberg cannot commit to"):
        IcebergSink("iceberg://ddb/kinesis.orders", APPLICATION).check_writable(RECORD_SCHEMA)


def test_a_catalog_configured_by_environment_variables_is_used(monkeypatch, tmp_path):
    for key, value in catalog_properties(tmp_path).items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__ENVLAKE__{key.upper()}", value)
    monkeypatch.setenv("PYICEBERG_CATALOG__ENVLAKE__TYPE", "sql")
    sink = IcebergSink("iceberg://envlake/kinesis.orders", APPLICATION)
    sink.catalog.create_namespace("kinesis")
    sink.check_writable(RECORD_SCHEMA)
    record = land(sink, None, TRIM_HORIZON, 1, 2)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    assert len(table_sequence_numbers(sink)) == 2


def test_a_missing_namespace_is_refused_before_anything_is_written(iceberg_catalog):
    sink = IcebergSink("iceberg://lake/elsewhere.orders", APPLICATION, catalog=iceberg_catalog)
    with pytest.raises(SinkError, match=r"namespace 'elsewhere' does not exist in catalog 'lake'"):
        sink.check_writable(RECORD_SCHEMA)


def test_batches_staged_before_the_partition_spec_changed_land_in_the_new_spec(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    table = sink.table()
    with table.update_spec() as update:
        update.add_identity("shard_id")

    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    table = sink.table(refresh=True)
    assert len(table.scan(row_filter="shard_id == 'shardId-000000000001'").to_arrow()) == 10
    specs = {task.file.spec_id for task in table.scan().plan_files()}
    assert specs == {table.metadata.default_spec_id}


def test_positions_outlive_the_expiry_of_the_applications_snapshots_by_another_tool(iceberg_catalog):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    table = sink.table(refresh=True)
    table.append(users_rows(table, 500, 2))
    table = sink.table(refresh=True)
    ours = [snapshot.snapshot_id for snapshot in table.snapshots() if snapshot.summary.get(SUMMARY_COMMIT_ID)]
    table.maintenance.expire_snapshots().by_ids(ours).commit()

    assert sink_on(iceberg_catalog).awaiting_visibility(record) == ()
    assert sink_on(iceberg_catalog).publish_round({"shardId-000000000001": record}, IDENTITY).batches_published == 0
    assert len(table_sequence_numbers(sink)) == 12


def test_batches_a_rollback_took_out_of_the_table_are_published_again(iceberg_catalog):
    """Their ranges are committed on the leases: the table must hold them."""
    sink = sink_on(iceberg_catalog)
    first = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": first}, IDENTITY)
    before = sink.table(refresh=True).current_snapshot().snapshot_id
    second = land(sink, first, position(10), 11, 5)
    sink.publish_round({"shardId-000000000001": second}, IDENTITY)
    table = sink.table(refresh=True)
    table.manage_snapshots().rollback_to_snapshot(before).commit()

    again = sink_on(iceberg_catalog).publish_round({"shardId-000000000001": second}, IDENTITY)

    assert (again.batches_published, again.batches_already_visible) == (1, 0)
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 16)]


def test_a_lease_refuses_more_waiting_batches_than_its_item_can_hold(iceberg_catalog, monkeypatch):
    """The rounds' commits keep failing: the lease's record would outgrow its DynamoDB item. The commit
    is refused (the batch stays prepared) until a round's commit takes what waits."""
    monkeypatch.setattr("sinks.table.lease_records.MAX_WAITING_BATCHES", 2)
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 5)
    record = land(sink, record, position(5), 6, 5)

    with pytest.raises(SinkError, match="has 2 committed batches waiting for the table's commit"):
        land(sink, record, position(10), 11, 5)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    assert land(sink, record, position(10), 11, 5).count('"15"') == 1


def test_a_slot_that_loses_the_race_to_add_a_column_finds_it_added_and_stages(iceberg_catalog):
    first, second = sink_on(iceberg_catalog), sink_on(iceberg_catalog)
    record = land(first, None, TRIM_HORIZON, 1, 3)
    second.table()  # its view of the table predates the column
    amount = pa.array([1.5, 2.5], pa.float64())
    iceberg_catalog.before_commit = lambda: first.stage(batch_of(position(3), 4, 2), rows(4, 2, amount=amount), "a")

    staged = second.stage(batch_of(position(3), 4, 2), rows(4, 2, amount=amount), "b")

    assert staged.rows == 2
    assert second.table(refresh=True).schema().find_field("amount")
    assert record


def test_a_batch_whose_manifest_is_gone_is_reported_missing_and_the_rest_lands(iceberg_catalog, tmp_path):
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    record = land(sink, record, position(10), 11, 5)
    manifests = sorted((tmp_path / "warehouse").rglob("kinesis-staged/*/*-m0.avro"), key=os.path.getmtime)
    manifests[0].unlink()

    published = sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    assert published.missing_batches == ("shardId-000000000001: the batch up to 10",)
    assert table_sequence_numbers(sink) == [str(n) for n in range(11, 16)]


def test_a_gone_position_map_stops_the_sink_with_an_error_naming_it_rather_than_publishing_again(
    iceberg_catalog, tmp_path
):
    """An external orphan-file cleanup that does not know the sink's files deleted the map."""
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    sink.publish_round({"shardId-000000000001": record}, IDENTITY)
    for position_map in (tmp_path / "warehouse").rglob("kinesis-positions/*/*.json"):
        position_map.unlink()

    with pytest.raises(SinkError, match=r"cannot read the position map .*kinesis-positions"):
        sink_on(iceberg_catalog).publish_round({"shardId-000000000001": record}, IDENTITY)
    assert len(table_sequence_numbers(sink)) == 10


def test_a_batch_without_rows_is_recorded_so_the_leases_chain_has_no_gap(iceberg_catalog):
    """A transform dropped every row, or the records aged out before a redo read them: the commit still
    moves the checkpoint, and the table's record of the lease must move with it."""
    sink = sink_on(iceberg_catalog)
    record = land(sink, None, TRIM_HORIZON, 1, 10)
    empty = sink.stage(batch_of(position(10), 11, 5), rows(11, 5).slice(0, 0), "a")
    record = sink.commit_record(record, empty)
    record = land(sink, record, position(15), 16, 5)

    sink.publish_round({"shardId-000000000001": record}, IDENTITY)

    landed = sink_on(iceberg_catalog).landed_batches()
    assert [(str(batch.start), str(batch.end)) for batch in landed] == [
        ("TRIM_HORIZON", "10"),
        ("10", "15"),
        ("15", "20"),
    ]
    assert len(table_sequence_numbers(sink)) == 15


def test_a_former_multi_stream_lease_of_a_re_created_stream_does_not_publish_its_batches_again(iceberg_catalog):
    """A multi-stream lease key carries its stream's creation epoch: the position under it is that
    incarnation's, whatever the stream of the same name is now."""
    key = f"000000000000:{STREAM}:{CREATED}:shardId-000000000001"
    sink = sink_on(iceberg_catalog)
    staged = sink.stage(dataclasses.replace(batch_of(TRIM_HORIZON, 1, 5), lease_key=key), rows(1, 5), "a")
    record = sink.commit_record(None, staged)
    sink.publish_round({key: record}, IDENTITY)
    again = {STREAM: (STREAM_ARN, CREATED + 86_400)}
    later = IcebergSink(URI, APPLICATION, catalog=iceberg_catalog, streams=again)

    assert later.awaiting_visibility(record) == ()
    assert later.publish_round({key: record}, RoundIdentity(APPLICATION, 8, again)).batches_published == 0
    assert table_sequence_numbers(sink) == [str(n) for n in range(1, 6)]
