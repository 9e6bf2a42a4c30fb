"""The Delta sink (`sinks.table.delta`) on a real Delta table in a local folder, written and read
by delta-rs: what a round's commit records, publishers racing for the same batches, a publisher that
died between its position map and its commit, and tables or batches it must refuse. The exactly-once
faults every sink meets are in tests/contract (`sinks_under_test`, its `delta` cases)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from lease_core.config.settings import ConsumerConfig
from lease_core.model.sequence import TRIM_HORIZON
from sinks import backfill_uri, check_sink_uri, open_sink
from sinks.batch_sink import RoundIdentity
from sinks.dead_lettering import dead_letter_uri
from sinks.errors import SinkError
from sinks.record_columns import with_stream_and_shard
from sinks.table.committer import SUMMARY_APPLICATION, SUMMARY_RANGES, SUMMARY_ROUND
from sinks.table.delta import (
    DeltaLocation,
    DeltaSink,
    parse_delta_uri,
    with_day,
)
from sinks.table.storage import TableStorage
from tests.support.iceberg_tables import batch_of, position, rows

APPLICATION = "orders-app"
STREAM_ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/orders"
IDENTITY = RoundIdentity(APPLICATION, 7, {"orders": (STREAM_ARN, 1_764_000_000)})
LEASE = "shardId-000000000001"


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"delta:{tmp_path / 'orders'}"


def land(sink: DeltaSink, record: str | None, start, first: int, count: int, attempt: str = "a") -> str:
    staged = sink.stage(batch_of(start, first, count), rows(first, count), attempt)
    committed = sink.commit_record(record, staged)
    assert committed is not None
    return committed


def sequence_numbers(uri: str) -> list[int]:
    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None
    numbers = [n for path in table.file_uris() for n in pq.read_table(path).column("sequence_number").to_pylist()]
    return sorted(int(n) for n in numbers)


def test_a_rounds_one_commit_adds_its_batches_with_the_application_round_and_ranges_in_the_log(uri):
    sink = DeltaSink(uri, APPLICATION)
    record = land(sink, None, TRIM_HORIZON, 1, 3)
    record = land(sink, record, position(3), 4, 2)

    published = sink.publish_round({LEASE: record}, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 2)
    assert sequence_numbers(uri) == [1, 2, 3, 4, 5]
    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None and table.metadata().partition_columns == ["arrival_day"]
    (newest, *_) = table.history(1)
    assert (newest[SUMMARY_APPLICATION], newest[SUMMARY_ROUND]) == (APPLICATION, "7")
    assert newest[SUMMARY_RANGES] == "shardId-000000000001 1-0..3-0; shardId-000000000001 4-0..5-0"
    assert published.snapshot_id == newest["version"]
    assert table.transaction_version(f"kinesis-lease-batch:{APPLICATION}") == 1
    assert DeltaSink(uri, APPLICATION).awaiting_visibility(record) == ()


def test_two_publishers_of_the_same_batches_cannot_both_add_them(uri, monkeypatch):
    """Driver A plans its commit (transaction version 1); driver B (a zombie of an earlier round)
    commits the same batches first, as version 2. A's commit of a version that is not newer than the
    table's is refused (delta-rs would not skip it itself: the two commits carry the same application
    transaction, so they conflict); A plans again on the new head, finds the batches held, and adds
    nothing. The application's version never goes back."""
    record = land(DeltaSink(uri, APPLICATION), None, TRIM_HORIZON, 1, 3)
    first, second = DeltaSink(uri, APPLICATION), DeltaSink(uri, APPLICATION)
    real_append = DeltaSink._append

    def append_after_the_other(self, *args, **kwargs):
        if self is first and not hasattr(self, "raced"):
            self.raced = True
            assert second.publish_round({LEASE: record}, IDENTITY).batches_published == 1
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(DeltaSink, "_append", append_after_the_other)

    published = first.publish_round({LEASE: record}, IDENTITY)

    assert (published.commits, published.batches_published, published.batches_already_visible) == (0, 0, 1)
    assert sequence_numbers(uri) == [1, 2, 3]
    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None and table.transaction_version(f"kinesis-lease-batch:{APPLICATION}") == 2


def test_a_publisher_that_died_between_its_position_map_and_its_commit_holds_nobody_up(uri):
    sink = DeltaSink(uri, APPLICATION)
    record = land(sink, None, TRIM_HORIZON, 1, 3)
    dead = Path(sink.location, sink.positions_path(1))
    dead.parent.mkdir(parents=True)
    dead.write_bytes(b'{"half": ')  # its map of version 1, written; its commit never made

    published = DeltaSink(uri, APPLICATION).publish_round({LEASE: record}, IDENTITY)

    assert published.batches_published == 1 and sequence_numbers(uri) == [1, 2, 3]
    table = sink.table()
    assert table is not None and table.transaction_version(f"kinesis-lease-batch:{APPLICATION}") == 2
    reader = DeltaSink(uri, APPLICATION)
    version, positions = reader.transaction_version(table), reader.positions_in(table)
    assert version == 2 and positions[LEASE].end == position(3)
    assert json.loads(Path(sink.location, sink.positions_path(2)).read_bytes())["round"] == 7


def test_each_application_keeps_its_own_position_map_in_one_table(uri):
    orders = DeltaSink(uri, APPLICATION)
    orders.publish_round({LEASE: land(orders, None, TRIM_HORIZON, 1, 3)}, IDENTITY)
    other = DeltaSink(uri, "payments-app")
    record = land(other, None, TRIM_HORIZON, 11, 2)

    assert other.awaiting_visibility(record) != ()
    other.publish_round({LEASE: record}, RoundIdentity("payments-app", 1, IDENTITY.streams))
    assert sequence_numbers(uri) == [1, 2, 3, 11, 12]


def test_a_column_of_a_conflicting_type_is_refused_naming_it_before_anything_is_written(uri):
    sink = DeltaSink(uri, APPLICATION)
    land(sink, None, TRIM_HORIZON, 1, 3)
    files_before = sorted(Path(sink.location).rglob("*"))
    conflicting = rows(4, 2, partition_key=pa.array([1, 2], pa.int64()))

    with pytest.raises(SinkError, match=r"column 'partition_key' is int64 in the batch but string"):
        sink.stage(batch_of(position(3), 4, 2), conflicting, "a")
    assert sorted(Path(sink.location).rglob("*")) == files_before


def test_a_transform_that_adds_a_column_evolves_the_table_by_name(uri):
    sink = DeltaSink(uri, APPLICATION)
    record = land(sink, None, TRIM_HORIZON, 1, 3)
    extra = rows(4, 2, amount=pa.array([1.5, 2.5], pa.float64()))
    record = sink.commit_record(record, sink.stage(batch_of(position(3), 4, 2), extra, "a"))
    sink.publish_round({LEASE: record}, IDENTITY)

    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None and "amount" in table.schema().to_arrow().names
    amounts = [value for path in table.file_uris() for value in _column(path, "amount")]
    assert sorted(amounts, key=lambda value: (value is not None, value)) == [None, None, None, 1.5, 2.5]


def test_a_batch_without_the_arrival_column_lands_in_the_null_day_partition(uri):
    sink = DeltaSink(uri, APPLICATION)
    record = land(sink, None, TRIM_HORIZON, 1, 3)
    without_arrival = rows(4, 2).drop_columns(["approximate_arrival_timestamp"])
    record = sink.commit_record(record, sink.stage(batch_of(position(3), 4, 2), without_arrival, "a"))
    sink.publish_round({LEASE: record}, IDENTITY)

    assert sequence_numbers(uri) == [1, 2, 3, 4, 5]
    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    days = {action["partition.arrival_day"] for action in actions}
    assert None in days and len(days) >= 2, "the first batch's days, and the null day of the one without arrivals"


def test_each_data_file_holds_the_rows_of_its_day_of_arrival(uri):
    """A batch across midnight (UTC) is one file per day; a batch of one day is one file of it."""
    sink = DeltaSink(uri, APPLICATION)
    record = land(sink, None, TRIM_HORIZON, 1, 3)  # arrived 23:59:59, then 00:00:00 and 00:00:01 of the next day
    record = land(sink, record, position(3), 4, 1)  # arrived 23:59:59
    sink.publish_round({LEASE: record}, IDENTITY)

    table = sink.table()
    assert table is not None
    files: dict[str, list[list[int]]] = {}
    for action in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        numbers = pq.read_table(f"{sink.location}/{action['path']}").column("sequence_number").to_pylist()
        files.setdefault(action["partition.arrival_day"], []).append(sorted(int(n) for n in numbers))
    assert {day: sorted(held) for day, held in files.items()} == {"2026-11-26": [[1], [4]], "2026-11-27": [[2, 3]]}


def _column(path: str, name: str) -> list[object]:
    """A column of a data file as a Delta reader sees it: null where the file predates the column."""
    data = pq.read_table(path)
    return data.column(name).to_pylist() if name in data.column_names else [None] * data.num_rows


def test_a_folder_that_is_not_a_delta_table_is_refused_before_any_lease_moves(tmp_path):
    folder = tmp_path / "orders"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a table")

    with pytest.raises(SinkError, match="not a Delta table"):
        DeltaSink(f"delta:{folder}", APPLICATION).check_writable(None)
    with pytest.raises(SinkError, match="does not exist"):
        DeltaSink(f"delta:{tmp_path / 'missing' / 'orders'}", APPLICATION).check_writable(None)


def test_a_backfill_table_goes_in_a_folder_the_project_creates_beside_the_live_table(tmp_path):
    live = f"delta:{tmp_path / 'lake' / 'orders'}"
    (tmp_path / "lake").mkdir()
    backfill = backfill_uri(live, "20261120T000000Z-20261121T000000Z")

    DeltaSink(backfill, APPLICATION).check_writable(rows(1, 3).schema)
    DeltaSink(dead_letter_uri(backfill), APPLICATION).check_writable(None)

    assert backfill == f"{live}-backfill/20261120T000000Z-20261121T000000Z"
    assert (tmp_path / "lake" / "orders-backfill").is_dir()
    with pytest.raises(SinkError, match=r"the folder '[^']*/lake/gone' the table goes in does not exist"):
        # the live table's own folder is the user's: a backfill of a table in a missing one creates nothing
        DeltaSink(backfill_uri(f"delta:{tmp_path / 'lake' / 'gone' / 'orders'}", "w"), APPLICATION).check_writable(None)
    assert not (tmp_path / "lake" / "gone").exists()


@pytest.mark.parametrize(
    ("uri", "place"),
    [
        pytest.param("delta:/data/orders", DeltaLocation("/data/orders"), id="absolute"),
        pytest.param("delta:file:///data/orders", DeltaLocation("/data/orders"), id="file-uri"),
        pytest.param("delta:s3://lake/tables/orders", DeltaLocation("tables/orders", "lake"), id="s3"),
    ],
)
def test_a_delta_uri_names_a_local_folder_or_an_s3_prefix(uri, place):
    assert parse_delta_uri(uri) == place
    assert check_sink_uri(uri + "/") == uri


def test_a_relative_delta_path_is_the_folder_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_delta_uri("delta:orders") == DeltaLocation(str(tmp_path / "orders"))
    sink = open_sink("delta:orders", config=ConsumerConfig(application_name=APPLICATION))
    assert isinstance(sink, DeltaSink) and sink.location == str(tmp_path / "orders")


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        pytest.param("delta:", "is not of the form", id="nothing"),
        pytest.param("delta:s3://lake", "needs a bucket and a prefix", id="bucket-root"),
        pytest.param("delta:s3:///orders", "needs a bucket and a prefix", id="no-bucket"),
        pytest.param("delta:gs://lake/orders", "is not of the form", id="other-store"),
    ],
)
def test_a_delta_uri_of_no_supported_form_is_refused_naming_it(uri, complaint):
    with pytest.raises(SinkError, match=complaint) as refused:
        check_sink_uri(uri)
    assert uri in str(refused.value)


def test_the_application_transaction_and_positions_survive_the_log_checkpoints_delta_rs_writes(uri):
    sink = DeltaSink(uri, APPLICATION)
    record = land(sink, None, TRIM_HORIZON, 1, 1)
    table = sink.table()
    assert table is not None
    table.alter.set_table_properties({"delta.checkpointInterval": "2"})
    sink.publish_round({LEASE: record}, IDENTITY)
    for first in range(2, 7):
        record = land(DeltaSink(uri, APPLICATION), None, position(first - 1), first, 1)
        DeltaSink(uri, APPLICATION).publish_round({LEASE: record}, IDENTITY)

    log = Path(uri.removeprefix("delta:"), "_delta_log")
    assert list(log.glob("*.checkpoint.parquet")) and (log / "_last_checkpoint").exists()
    reopened = DeltaSink(uri, APPLICATION)
    table = reopened.table()
    assert table is not None
    version, positions = reopened.transaction_version(table), reopened.positions_in(table)
    assert version == 6 and positions[LEASE].end == position(6)
    assert reopened.publish_round({LEASE: record}, IDENTITY).batches_already_visible == 1  # a zombie's replay
    assert sequence_numbers(uri) == [1, 2, 3, 4, 5, 6]


# --- the table the sink creates, and tables it cannot write as their protocol asks -----------------


def _table_type(uri: str, name: str) -> pa.DataType:
    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None
    return pa.schema(table.schema().to_arrow()).field(name).type


def _landed_column(uri: str, name: str) -> list[object]:
    landed = DeltaSink(uri, APPLICATION).visible_rows(["sequence_number", name])
    assert landed is not None
    return [row[name] for row in sorted(landed.to_pylist(), key=lambda row: int(row["sequence_number"]))]


def test_a_table_created_for_nanosecond_timestamps_is_one_every_delta_reader_can_read(uri):
    """pandas makes nanosecond timestamps; Delta's timestamp holds microseconds. A table typed
    `timestamp_nanos` needs the reader feature `timestampNanos`, which neither delta-rs' reader nor
    Spark reads: the rounds would land, exactly once, in a table nobody can query."""
    seen = pa.array([1_764_000_000_000_000_000 + n * 1000 for n in range(3)], pa.timestamp("ns", tz="UTC"))
    sink = DeltaSink(uri, APPLICATION)
    record = sink.commit_record(None, sink.stage(batch_of(TRIM_HORIZON, 1, 3), rows(1, 3, seen=seen), "a"))
    sink.publish_round({LEASE: record}, IDENTITY)

    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None
    assert "timestampNanos" not in (table.protocol().reader_features or [])
    assert _table_type(uri, "seen") == pa.timestamp("us", tz="UTC")
    assert _landed_column(uri, "seen") == seen.cast(pa.timestamp("us", tz="UTC")).to_pylist()


@pytest.mark.parametrize(
    ("column", "delta_type"),
    [
        pytest.param(pa.array(["a", "b", "c"], pa.large_string()), pa.string(), id="large_string (Polars)"),
        pytest.param(pa.array(["a", "b", "c"], pa.string_view()), pa.string(), id="string_view"),
        pytest.param(pa.array(["a", "b", "a"]).dictionary_encode(), pa.string(), id="dictionary (pandas category)"),
        pytest.param(pa.array([b"a", b"b", b"c"], pa.large_binary()), pa.binary(), id="large_binary"),
        pytest.param(pa.array([[1], [2], [3]], pa.large_list(pa.int64())), pa.list_(pa.int64()), id="large_list"),
        pytest.param(pa.array([1, 2, 4_000_000_000], pa.uint32()), pa.int64(), id="uint32"),
        pytest.param(pa.array([1, 2, 3], pa.timestamp("s", tz="UTC")), pa.timestamp("us", tz="UTC"), id="seconds"),
    ],
)
def test_a_batch_lands_in_the_table_the_sink_creates_for_it_whatever_the_arrow_encoding(uri, column, delta_type):
    """The sink creates the table from the first batch's columns; it must then hold that batch (and
    the next, in the plain encoding), not refuse it round after round."""
    sink = DeltaSink(uri, APPLICATION)
    sink.check_writable(rows(1, 3, x=column).schema)
    record = sink.commit_record(None, sink.stage(batch_of(TRIM_HORIZON, 1, 3), rows(1, 3, x=column), "a"))
    plain = rows(4, 3, x=column.cast(delta_type))
    record = sink.commit_record(record, sink.stage(batch_of(position(3), 4, 3), plain, "a"))
    sink.publish_round({LEASE: record}, IDENTITY)

    assert _table_type(uri, "x") == delta_type
    expected = column.cast(delta_type).to_pylist()
    assert _landed_column(uri, "x") == expected + expected


@pytest.mark.parametrize(
    "column",
    [
        pytest.param(pa.array([1, 2, 3], pa.duration("s")), id="duration"),
        pytest.param(pa.array([1, 2, 3], pa.time64("us")), id="time64"),
        pytest.param(pa.array([1, 2, 2**64 - 1], pa.uint64()), id="uint64"),
    ],
)
def test_a_column_no_delta_type_holds_is_refused_naming_it_before_the_table_is_made(uri, column):
    sink = DeltaSink(uri, APPLICATION)

    with pytest.raises(SinkError, match=r"column 'x'"):
        sink.check_writable(rows(1, 3, x=column).schema)
    with pytest.raises(SinkError, match=r"column 'x'"):
        sink.stage(batch_of(TRIM_HORIZON, 1, 3), rows(1, 3, x=column), "a")
    assert sink.table() is None


def _others_table(uri: str, extra: Sequence[pa.Field] = (), **options: Any) -> str:
    """A table another engine made at `uri` with every column a batch of `rows` has (so that the sink
    adds none), plus `extra` columns."""
    columns = with_day(with_stream_and_shard(rows(1, 1), "orders", LEASE)).schema
    path = uri.removeprefix("delta:")
    write_deltalake(path, pa.schema([*columns, *extra]).empty_table(), **options)
    return path


def _others_table_with_constraint(uri: str) -> str:
    path = _others_table(uri)
    DeltaTable(path).alter.add_constraint({"positive_sub_sequence": "sub_sequence_number > 0"})
    return path


@pytest.mark.parametrize(
    ("make", "complaint"),
    [
        pytest.param(
            lambda uri: _others_table(uri, configuration={"delta.columnMapping.mode": "name"}),
            "column mapping",
            id="column-mapping",
        ),
        pytest.param(
            lambda uri: _others_table(
                uri, partition_by=["arrival_day"], configuration={"delta.columnMapping.mode": "name"}
            ),
            "column mapping",
            id="column-mapping-partitioned",
        ),
        pytest.param(_others_table_with_constraint, "positive_sub_sequence", id="check-constraint"),
        pytest.param(
            lambda uri: _others_table(
                uri, extra=[pa.field("doubled", pa.int64(), metadata={"delta.generationExpression": "2 * 1"})]
            ),
            "'doubled' is a generated column",
            id="generated-column",
        ),
        pytest.param(
            lambda uri: _others_table(uri, extra=[pa.field("tenant", pa.string(), nullable=False)]),
            "'tenant'",
            id="not-null-column-the-batches-lack",
        ),
    ],
)
def test_a_table_whose_protocol_asks_what_the_sink_does_not_do_is_refused_before_any_lease_moves(uri, make, complaint):
    """The sink writes Parquet files itself and adds them to the log: it neither names columns by
    their physical names (column mapping: Spark reads the files' columns as nulls), nor checks a CHECK
    constraint, nor can fill a NOT NULL column its batches lack. Such a table is refused when the job
    checks its output, not after the slots moved their checkpoints."""
    make(uri)
    sink = DeltaSink(uri, APPLICATION)

    with pytest.raises(SinkError, match=complaint):
        sink.check_writable(rows(1, 3).schema)
    with pytest.raises(SinkError, match=complaint):
        sink.stage(batch_of(TRIM_HORIZON, 1, 3), rows(1, 3), "a")


def test_a_column_differing_from_a_table_column_only_in_case_is_refused_naming_both(uri):
    """Delta's column names are case-insensitive: `Amount` beside `amount` is a table Spark refuses."""
    sink = DeltaSink(uri, APPLICATION)
    land(sink, None, TRIM_HORIZON, 1, 3)
    sink.commit_record(None, sink.stage(batch_of(position(3), 4, 1), rows(4, 1, amount=pa.array([1.0])), "a"))

    with pytest.raises(SinkError, match=r"'Amount'.*'amount'"):
        DeltaSink(uri, APPLICATION).check_writable(rows(5, 1, Amount=pa.array([1.0])).schema)


# --- another writer of the table committing while a round's commit is planned ----------------------


class CoWrittenStorage:
    """The sink's storage, except that another writer appends to the table whenever the sink claims a
    position map: between the publisher's reading of the head and its commit, every time."""

    def __init__(self, storage: TableStorage, append: Callable[[], None]) -> None:
        self._storage = storage
        self._append = append
        self.appends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def create(self, path: str, payload: bytes) -> bool:
        self._append()
        self.appends += 1
        return self._storage.create(path, payload)


def _users_append(uri: str) -> Callable[[], None]:
    """Another writer's append of two rows of its own (a streaming job, another pipeline) to the table."""
    path = uri.removeprefix("delta:")

    def append() -> None:
        schema = pa.schema(DeltaTable(path).schema().to_arrow())
        theirs = with_day(with_stream_and_shard(rows(900, 2), "theirs", "shardId-000000000009")).select(schema.names)
        write_deltalake(path, theirs.cast(schema), mode="append")

    return append


def test_a_rounds_commit_lands_while_another_writer_keeps_committing_to_the_table(uri):
    """A table shared with a streaming writer that commits every second sees a commit land between any
    publisher's reading of the head and its commit. An append of someone else's conflicts with nothing
    the round adds: the round's commit must land, once, rather than plan again until it gives up and
    leaves its batches waiting round after round."""
    sink = DeltaSink(uri, APPLICATION)
    record = land(sink, None, TRIM_HORIZON, 1, 3)
    publisher = DeltaSink(uri, APPLICATION)
    storage = CoWrittenStorage(publisher.storage, _users_append(uri))
    publisher.storage = storage  # type: ignore[assignment]

    published = publisher.publish_round({LEASE: record}, IDENTITY)

    assert (published.commits, published.batches_published) == (1, 1)
    assert [n for n in sequence_numbers(uri) if n < 900] == [1, 2, 3]
    assert sequence_numbers(uri).count(900) == storage.appends
    table = DeltaSink(uri, APPLICATION).table()
    assert table is not None
    reader = DeltaSink(uri, APPLICATION)
    version, positions = reader.transaction_version(table), reader.positions_in(table)
    assert version == table.transaction_version(f"kinesis-lease-batch:{APPLICATION}") and positions[
        LEASE
    ].end == position(3)
