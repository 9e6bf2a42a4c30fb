"""The Parquet sink: deterministic batch paths, atomic staging, adopting and making visible (the
`BatchSink` protocol), and readers of the dataset (pyarrow.dataset, pandas, Spark) on a local disk and
on S3 (moto)."""

from __future__ import annotations

import os
import pickle
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtools.emulators import LOOPBACK, free_port
from lease_core.model.sequence import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber, Sentinel
from lease_core.retrieval.kinesis_records import KinesisRecord
from sinks.batch_sink import BatchRange, RoundIdentity, RoundPublication, StagedBatch, Visibility
from sinks.errors import SinkError
from sinks.parquet import (
    DATASET_SCHEMA,
    WRITE_CHECK_NAME,
    ParquetSink,
    batch_file_name,
    staged_path,
    visible_path,
)
from sinks.record_columns import RECORD_SCHEMA, records_table
from spark_jobs.transform import apply_transform, load_transform

ARRIVAL = datetime(2026, 11, 2, 8, 30, tzinfo=UTC)
STREAM = "orders"
SHARD = "shardId-000000000001"
OTHER_SHARD = "shardId-000000000002"
BIG = "49590338271490256608559692538361571095921575989136588898"


def position(sequence_number: str, sub_sequence_number: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(sequence_number, sub_sequence_number)


def rows(first: int, count: int) -> pa.Table:
    """Records numbered first..first+count-1, each payload naming its number."""
    return records_table(
        [
            KinesisRecord(str(n), 0, f"key-{n % 3}", ARRIVAL + timedelta(milliseconds=n), f"payload {n}".encode())
            for n in range(first, first + count)
        ]
    )


def batch_range(start: ExtendedSequenceNumber, end: ExtendedSequenceNumber, shard: str = SHARD) -> BatchRange:
    return BatchRange(shard, STREAM, shard, start, None, end)


def publish(sink: ParquetSink, batch: BatchRange, table: pa.Table) -> StagedBatch:
    """Stages the batch and makes it visible, as the consume job does around the batch's commit."""
    staged = sink.stage(batch, table, "attempt-0")
    assert sink.make_visible(sink.commit_record(None, staged)) is Visibility.VISIBLE
    return staged


def publish_batch(sink: ParquetSink, first: int, count: int, shard: str = SHARD) -> str:
    """Publishes the batch (first - 1, first + count - 1], as the consume job names it; its file's path."""
    batch = batch_range(position(str(first - 1)), position(str(first + count - 1)), shard)
    publish(sink, batch, rows(first, count))
    return sink.batch_name(batch)


def sequence_numbers(table: pa.Table) -> list[int]:
    return sorted(int(value) for value in table["sequence_number"].to_pylist())


def new_bucket(endpoint: str) -> str:
    name = f"sink-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=[pytest.param("local"), pytest.param("s3", marks=pytest.mark.moto)])
def sink(request: pytest.FixtureRequest, tmp_path) -> ParquetSink:
    """An empty dataset on a local disk, then in a fresh S3 bucket."""
    if request.param == "local":
        return ParquetSink.from_uri(str(tmp_path / "dataset"))
    endpoint = request.getfixturevalue("moto_endpoint")
    return ParquetSink.from_uri(f"s3://{new_bucket(endpoint)}/dataset", s3_endpoint_url=endpoint)


# --- Names: a pure function of (stream, shard, start, end) ----------------------------------------

FILE_NAMES = [
    pytest.param(position("1"), position("2"), "1-0_2-0.parquet", id="numbers"),
    pytest.param(position(BIG), position(BIG, 7), f"{BIG}-0_{BIG}-7.parquet", id="sub-sequence-numbers"),
    pytest.param(position("100", 3), position("250"), "100-3_250-0.parquet", id="aggregate-start"),
    pytest.param(TRIM_HORIZON, position("5"), "TRIM_HORIZON_5-0.parquet", id="trim-horizon"),
    pytest.param(LATEST, position("5"), "LATEST_5-0.parquet", id="latest"),
    pytest.param(AT_TIMESTAMP, position("5", 1), "AT_TIMESTAMP_5-1.parquet", id="at-timestamp"),
    pytest.param(position("5"), SHARD_END, "5-0_SHARD_END.parquet", id="shard-end"),
    pytest.param(position("007"), position("0010"), "7-0_10-0.parquet", id="leading-zeros-are-the-same-number"),
    pytest.param(position("TRIM_HORIZON", 3), position("5"), "TRIM_HORIZON-3_5-0.parquet", id="odd-sentinel"),
]


@pytest.mark.parametrize(("start", "end", "name"), FILE_NAMES)
def test_the_batch_file_name_is_the_labels_of_the_range_start_and_end(start, end, name) -> None:
    assert batch_file_name(start, end) == name


positions = st.one_of(
    st.builds(ExtendedSequenceNumber, st.sampled_from([s.value for s in Sentinel]), st.integers(0, 2)),
    st.builds(ExtendedSequenceNumber, st.from_regex(r"0{0,2}[0-9]{1,3}", fullmatch=True), st.integers(0, 2)),
    st.builds(ExtendedSequenceNumber, st.from_regex(r"[1-9][0-9]{20,56}", fullmatch=True), st.integers(0, 2**63)),
)


@given(positions, positions, positions, positions)
def test_two_ranges_share_a_file_name_exactly_when_they_are_equal(a, b, c, d) -> None:
    assert (batch_file_name(a, b) == batch_file_name(c, d)) == ((a, b) == (c, d))


def test_the_batch_name_puts_stream_and_shard_in_hive_directories_whatever_the_root(tmp_path) -> None:
    paths = {
        ParquetSink.from_uri(uri).batch_name(batch_range(position("1", 2), position("9")))
        for uri in (str(tmp_path / "a"), f"file://{tmp_path}/b")
    }
    assert paths == {f"stream_name=orders/shard_id={SHARD}/1-2_9-0.parquet"}


BAD_PARTITION_VALUES = [
    pytest.param("a/b", SHARD, id="slash-in-stream"),
    pytest.param(STREAM, "shard=1", id="equals-in-shard"),
    pytest.param("", SHARD, id="empty-stream"),
    pytest.param(STREAM, "shard%2F1", id="percent-in-shard"),
]


@pytest.mark.parametrize(("stream_name", "shard_id"), BAD_PARTITION_VALUES)
def test_a_name_that_cannot_be_a_partition_directory_is_refused(tmp_path, stream_name, shard_id) -> None:
    with pytest.raises(SinkError, match="cannot name a partition directory"):
        ParquetSink.from_uri(str(tmp_path)).batch_name(
            BatchRange(shard_id, stream_name, shard_id, TRIM_HORIZON, None, position("1"))
        )


# --- Publishing and reading, on both storages -----------------------------------------------------


def test_published_batches_read_back_through_pyarrow_dataset_with_their_partitions(sink: ParquetSink) -> None:
    publish_batch(sink, 1, 3)
    publish_batch(sink, 4, 2)
    publish_batch(sink, 1, 4, shard=OTHER_SHARD)
    dataset = ds.dataset(sink.root, filesystem=sink.filesystem, format="parquet", partitioning="hive")
    table = dataset.to_table()
    assert table.num_rows == 9
    assert table.schema.names == [*RECORD_SCHEMA.names, "stream_name", "shard_id"]
    by_shard = table.group_by("shard_id").aggregate([("sequence_number", "count")]).to_pylist()
    assert sorted((row["shard_id"], row["sequence_number_count"]) for row in by_shard) == [(SHARD, 5), (OTHER_SHARD, 4)]
    assert set(table["stream_name"].to_pylist()) == {STREAM}


def test_read_dataset_returns_every_row_with_string_partition_columns(sink: ParquetSink) -> None:
    publish_batch(sink, 1, 3)
    publish_batch(sink, 1, 2, shard=OTHER_SHARD)
    table = sink.read_dataset()
    assert table.schema.equals(DATASET_SCHEMA)
    rows = sorted((row["shard_id"], int(row["sequence_number"]), row["data"]) for row in table.to_pylist())
    assert rows == [
        (SHARD, 1, b"payload 1"),
        (SHARD, 2, b"payload 2"),
        (SHARD, 3, b"payload 3"),
        (OTHER_SHARD, 1, b"payload 1"),
        (OTHER_SHARD, 2, b"payload 2"),
    ]


def test_pandas_reads_the_dataset_with_the_partition_columns(sink: ParquetSink) -> None:
    publish_batch(sink, 1, 3)
    publish_batch(sink, 1, 2, shard=OTHER_SHARD)
    frame = pd.read_parquet(sink.root, filesystem=sink.filesystem)
    assert len(frame) == 5
    assert sorted(zip(frame["shard_id"].astype(str), frame["sequence_number"], strict=True)) == [
        (SHARD, "1"),
        (SHARD, "2"),
        (SHARD, "3"),
        (OTHER_SHARD, "1"),
        (OTHER_SHARD, "2"),
    ]


def test_a_staged_batch_is_named_by_its_staged_file_and_becomes_the_batch_file(sink: ParquetSink) -> None:
    batch = batch_range(TRIM_HORIZON, position("3"))
    path = sink.batch_name(batch)
    staged = sink.stage(batch, rows(1, 3), "attempt-0")
    size = sink.filesystem.get_file_info(f"{sink.root}/{staged.token}").size
    assert staged == StagedBatch(staged_path(path, "attempt-0"), rows=3, bytes=size, already_present=False)
    assert staged.token == sink.staged_token(batch, "attempt-0"), "the prepare knows the token in advance"
    assert sink.commit_record("an earlier batch's staged file", staged) == staged.token
    assert sink.make_visible(staged.token) is Visibility.VISIBLE
    assert (sink.exists(path), sink.row_count(path)) == (True, 3)


def test_staging_a_batch_again_replaces_the_staged_file_with_identical_bytes_and_no_duplicate_rows(
    sink: ParquetSink,
) -> None:
    batch = batch_range(position("0"), position("3"))
    first = sink.stage(batch, rows(1, 3), "attempt-0")
    with sink.filesystem.open_input_file(f"{sink.root}/{first.token}") as file:
        original = file.read()
    again = sink.stage(batch, rows(1, 3), "attempt-0")
    with sink.filesystem.open_input_file(f"{sink.root}/{first.token}") as file:
        assert file.read() == original
    assert (first.already_present, again.already_present, again.rows, again.bytes) == (False, True, 3, first.bytes)
    assert sink.make_visible(again.token) is Visibility.VISIBLE
    assert sequence_numbers(sink.read_dataset()) == [1, 2, 3]


def test_a_staged_file_is_invisible_to_every_reader_until_it_is_made_visible(sink: ParquetSink) -> None:
    batch = batch_range(position("0"), position("3"))
    path = sink.batch_name(batch)
    staged = sink.stage(batch, rows(1, 3), "attempt-0").token
    assert staged is not None
    assert (sink.exists(staged), sink.exists(path), sink.row_count(staged)) == (True, False, 3)
    assert sink.awaiting_visibility(staged) == (path,)
    assert sink.read_dataset().num_rows == 0
    assert len(pd.read_parquet(sink.root, filesystem=sink.filesystem)) == 0
    assert sink.make_visible(staged) is Visibility.VISIBLE
    assert (sink.exists(staged), sink.exists(path), sink.row_count(path)) == (False, True, 3)
    assert sink.awaiting_visibility(staged) == ()
    assert len(pd.read_parquet(sink.root, filesystem=sink.filesystem)) == 3


def test_each_attempt_stages_under_a_name_of_its_own_beside_the_batch_file() -> None:
    path = "stream_name=s/shard_id=x/0-0_3-0.parquet"
    names = {staged_path(path, attempt) for attempt in ("w-0/attempt-0/1/a", "w-0/attempt-1/2/b")}
    assert len(names) == 2
    for staged in names:
        assert staged.startswith("stream_name=s/shard_id=x/_staged-") and visible_path(staged) == path
    with pytest.raises(ValueError, match="not the name of a staged batch file"):
        visible_path(path)


def test_making_a_batch_visible_again_or_after_another_promoter_finds_it_visible(sink: ParquetSink) -> None:
    staged = sink.stage(batch_range(position("0"), position("3")), rows(1, 3), "attempt-0").token
    assert [sink.make_visible(staged), sink.make_visible(staged)] == [Visibility.VISIBLE, Visibility.VISIBLE]
    assert sequence_numbers(sink.read_dataset()) == [1, 2, 3]


def test_a_committed_batch_that_was_never_staged_is_missing_and_awaits_nothing(sink: ParquetSink) -> None:
    staged = sink.staged_token(batch_range(position("0"), position("3")), "attempt-0")
    assert sink.make_visible(staged) is Visibility.MISSING
    assert sink.awaiting_visibility(staged) == ()
    assert sink.read_dataset().num_rows == 0


RECORDS_NAMING_NOTHING = [
    pytest.param(None, id="none"),
    pytest.param("stream_name=orders/shard_id=x/1-0_2-0.parquet", id="a-visible-name"),
    pytest.param("snapshot 42", id="another-sinks-record"),
]


@pytest.mark.parametrize("record", RECORDS_NAMING_NOTHING)
def test_a_record_that_is_not_a_staged_file_of_ours_names_no_batch(sink: ParquetSink, record: str | None) -> None:
    assert (sink.make_visible(record), sink.awaiting_visibility(record)) == (Visibility.VISIBLE, ())
    assert sink.commit_record(record, None) is None


def test_a_late_stage_by_a_fenced_attempt_never_shows_beside_the_committed_batches(sink: ParquetSink) -> None:
    """Hole 4 of issue 13: a batch discarded by a reset and staged late by its zombie stays invisible."""
    # The next round re-read the range with another end and committed it.
    publish(sink, batch_range(position("0"), position("5")), rows(1, 5))
    # The zombie's late write: its commit then fails, it never makes its batch visible.
    sink.stage(batch_range(position("0"), position("3")), rows(1, 3), "zombie")
    assert sequence_numbers(sink.read_dataset()) == [1, 2, 3, 4, 5]
    dataset = ds.dataset(sink.root, filesystem=sink.filesystem, format="parquet", partitioning="hive")
    assert dataset.to_table().num_rows == 5


def test_adopting_copies_another_attempts_staged_file_to_this_attempts_own_name(sink: ParquetSink) -> None:
    batch = batch_range(position("0"), position("3"))
    theirs = sink.stage(batch, rows(1, 3), "attempt-0")
    assert theirs.token is not None
    ours = sink.adopt(theirs.token, batch, "attempt-1")
    assert ours == StagedBatch(sink.staged_token(batch, "attempt-1"), rows=3, bytes=theirs.bytes)
    assert sink.make_visible(sink.commit_record(None, ours)) is Visibility.VISIBLE
    assert sink.exists(theirs.token), "the other attempt's file is left alone"
    assert sequence_numbers(sink.read_dataset()) == [1, 2, 3]


def test_adopting_a_batch_published_before_its_commit_gives_its_rows_and_nothing_to_make_visible(
    sink: ParquetSink,
) -> None:
    publish_batch(sink, 1, 3)  # (0, 3] made visible, as an earlier version did before committing it
    batch = batch_range(position("0"), position("3"))
    for staged in (None, sink.staged_token(batch, "attempt-9")):
        assert sink.adopt(staged, batch, "attempt-1") == StagedBatch(None, rows=3, bytes=0)


def test_adopting_a_batch_nobody_staged_gives_nothing_so_it_is_read_again(sink: ParquetSink) -> None:
    batch = batch_range(position("0"), position("3"))
    assert sink.adopt(sink.staged_token(batch, "attempt-0"), batch, "attempt-1") is None
    assert sink.adopt(None, batch, "attempt-1") is None


IDENTITY = RoundIdentity("app", 7, {STREAM: (f"arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}", 1)})


def test_publishing_a_round_promotes_what_commits_left_staged_and_counts_the_rest(sink: ParquetSink) -> None:
    visible = publish(sink, batch_range(position("0"), position("3")), rows(1, 3)).token
    left_staged = sink.stage(batch_range(position("3"), position("5")), rows(4, 2), "attempt-0").token
    deleted = batch_range(position("5"), position("6"), OTHER_SHARD)
    assert visible is not None and left_staged is not None
    records = {"visible": visible, "left staged": left_staged, "deleted": sink.staged_token(deleted, "attempt-0")}
    assert sink.publish_round(records, IDENTITY) == RoundPublication(
        commits=0,
        batches_published=1,
        batches_already_visible=1,
        missing_batches=(f"deleted: {sink.batch_name(deleted)}",),
    )
    assert sequence_numbers(sink.read_dataset()) == [1, 2, 3, 4, 5]


def test_a_file_whose_name_starts_with_an_underscore_is_never_read(sink: ParquetSink) -> None:
    path = publish_batch(sink, 1, 3)
    # What a stage that crashed before its rename leaves behind: a partial file under a staging name.
    directory = path.rsplit("/", 1)[0]
    with sink.filesystem.open_output_stream(f"{sink.root}/{directory}/_0f3a9c.4-0_9-0.parquet") as file:
        file.write(b"PAR1 half of a parquet file")
    assert sequence_numbers(sink.read_dataset()) == [1, 2, 3]
    assert ds.dataset(sink.root, filesystem=sink.filesystem, partitioning="hive").to_table().num_rows == 3
    assert len(pd.read_parquet(sink.root, filesystem=sink.filesystem)) == 3


def test_reading_a_dataset_nothing_was_published_to_gives_an_empty_table(sink: ParquetSink) -> None:
    assert sink.read_dataset().num_rows == 0
    sink.check_writable(RECORD_SCHEMA)
    assert sink.read_dataset().schema.equals(DATASET_SCHEMA)


def test_check_writable_passes_on_a_fresh_root_and_leaves_only_a_file_readers_skip(sink: ParquetSink) -> None:
    sink.check_writable(RECORD_SCHEMA)
    sink.check_writable(RECORD_SCHEMA)
    names = [info.base_name for info in sink.filesystem.get_file_info(pafs.FileSelector(sink.root, recursive=True))]
    assert names == [WRITE_CHECK_NAME]
    publish_batch(sink, 1, 2)
    assert sequence_numbers(sink.read_dataset()) == [1, 2]


def test_row_count_of_a_missing_file_is_a_sink_error_that_is_not_retryable(sink: ParquetSink) -> None:
    with pytest.raises(SinkError) as raised:
        sink.row_count("stream_name=orders/shard_id=x/1-0_2-0.parquet")
    assert not raised.value.retryable
    assert raised.value.uri == sink.uri


def test_a_transform_that_adds_the_partition_columns_cannot_stage(sink: ParquetSink) -> None:
    spec = "tests.support.transforms:with_partition_columns"
    table = apply_transform(spec, load_transform(spec), rows(1, 2))
    with pytest.raises(SinkError, match=r"\['stream_name', 'shard_id'\]; partition values live in paths only"):
        sink.stage(batch_range(TRIM_HORIZON, position("2")), table, "attempt-0")
    assert sink.read_dataset().num_rows == 0


def test_a_transformed_batch_is_published_with_its_extra_columns(sink: ParquetSink) -> None:
    spec = "tests.support.transforms:with_payload_size"
    table = apply_transform(spec, load_transform(spec), rows(1, 2))
    assert publish(sink, batch_range(TRIM_HORIZON, position("2")), table).rows == 2
    assert sink.read_dataset()["payload_size"].to_pylist() == [9, 9]


# --- Local disk ------------------------------------------------------------------------------------


def test_a_published_file_leaves_no_staging_file_behind(tmp_path) -> None:
    sink = ParquetSink.from_uri(str(tmp_path))
    directory, name = os.path.split(tmp_path / publish_batch(sink, 1, 3))
    assert os.listdir(directory) == [name]


def test_a_file_where_a_partition_directory_belongs_makes_staging_fail_without_retry(tmp_path) -> None:
    sink = ParquetSink.from_uri(str(tmp_path))
    (tmp_path / f"stream_name={STREAM}").write_text("not a directory")
    with pytest.raises(SinkError) as raised:
        publish_batch(sink, 1, 3)
    assert not raised.value.retryable
    assert raised.value.uri == str(tmp_path)
    assert f"cannot stage stream_name={STREAM}/shard_id={SHARD}/_staged-" in str(raised.value)


def test_check_writable_refuses_a_root_that_is_a_file(tmp_path) -> None:
    (tmp_path / "dataset").write_text("")
    with pytest.raises(SinkError, match="exists and is not a directory") as raised:
        ParquetSink.from_uri(str(tmp_path / "dataset")).check_writable(RECORD_SCHEMA)
    assert not raised.value.retryable


def test_check_writable_refuses_a_root_below_a_file(tmp_path) -> None:
    (tmp_path / "blocker").write_text("")
    with pytest.raises(SinkError, match="cannot check that the dataset root is writable") as raised:
        ParquetSink.from_uri(str(tmp_path / "blocker" / "dataset")).check_writable(RECORD_SCHEMA)
    assert not raised.value.retryable


def test_a_relative_path_is_resolved_against_the_working_directory(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sink = ParquetSink.from_uri("out/dataset")
    assert (sink.uri, sink.root) == ("out/dataset", str(tmp_path / "out" / "dataset"))
    publish_batch(sink, 1, 1)
    assert sequence_numbers(ParquetSink.from_uri(f"file://{tmp_path}/out/dataset").read_dataset()) == [1]


BAD_URIS = [
    pytest.param("", id="empty"),
    pytest.param("s3a://bucket/prefix", id="s3a"),
    pytest.param("gs://bucket/prefix", id="gcs"),
    pytest.param("s3:///prefix", id="s3-without-bucket"),
    pytest.param("file://relative/path", id="file-with-host"),
]


@pytest.mark.parametrize("uri", BAD_URIS)
def test_a_uri_that_is_neither_a_local_path_nor_s3_is_refused_by_name(uri: str) -> None:
    with pytest.raises(SinkError, match="is not a local path") as raised:
        ParquetSink.from_uri(uri)
    assert raised.value.uri == uri


def test_spark_reads_the_dataset_with_partition_columns_and_skips_staging_files(tmp_path, spark) -> None:
    sink = ParquetSink.from_uri(str(tmp_path / "dataset"))
    publish_batch(sink, 1, 3)
    publish_batch(sink, 1, 2, shard=OTHER_SHARD)
    (tmp_path / "dataset" / f"stream_name={STREAM}" / f"shard_id={SHARD}" / "_0f3a9c.9-0_12-0.parquet").write_bytes(
        b"P"
    )
    rows = (
        spark.read.parquet(str(tmp_path / "dataset"))
        .selectExpr(
            "stream_name", "shard_id", "sequence_number", "data", "unix_millis(approximate_arrival_timestamp)"
        )  # epoch millis: no session time zone involved
        .collect()
    )
    arrival = int(ARRIVAL.timestamp() * 1000)
    assert sorted(
        (stream, shard, int(number), bytes(data), millis) for stream, shard, number, data, millis in rows
    ) == [
        (STREAM, SHARD, 1, b"payload 1", arrival + 1),
        (STREAM, SHARD, 2, b"payload 2", arrival + 2),
        (STREAM, SHARD, 3, b"payload 3", arrival + 3),
        (STREAM, OTHER_SHARD, 1, b"payload 1", arrival + 1),
        (STREAM, OTHER_SHARD, 2, b"payload 2", arrival + 2),
    ]


# --- S3 --------------------------------------------------------------------------------------------


@pytest.mark.moto
def test_a_missing_bucket_fails_check_writable_publish_and_reads_naming_the_bucket(moto_endpoint: str) -> None:
    sink = ParquetSink.from_uri("s3://no-such-bucket-here/dataset", s3_endpoint_url=moto_endpoint)
    with pytest.raises(SinkError, match="bucket 'no-such-bucket-here' does not exist") as checked:
        sink.check_writable(RECORD_SCHEMA)
    with pytest.raises(SinkError, match="bucket 'no-such-bucket-here' does not exist") as read:
        sink.read_dataset()
    with pytest.raises(SinkError, match="no-such-bucket-here") as published:
        publish_batch(sink, 1, 1)
    assert not any(raised.value.retryable for raised in (checked, read, published))
    assert published.value.uri == "s3://no-such-bucket-here/dataset"


ENDPOINT_VARIABLES = [
    pytest.param("AWS_ENDPOINT_URL_S3", id="service-variable"),
    pytest.param("AWS_ENDPOINT_URL", id="global-variable"),
]


@pytest.mark.moto
@pytest.mark.parametrize("variable", ENDPOINT_VARIABLES)
def test_the_s3_endpoint_comes_from_the_standard_environment_variables(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, moto_endpoint)
    sink = ParquetSink.from_uri(f"s3://{new_bucket(moto_endpoint)}/dataset")
    path = publish_batch(sink, 1, 2)
    assert sink.exists(path)
    assert sink.row_count(path) == 2


@pytest.mark.moto
def test_an_explicit_endpoint_wins_over_the_environment(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{LOOPBACK}:{free_port()}")
    sink = ParquetSink.from_uri(f"s3://{new_bucket(moto_endpoint)}", s3_endpoint_url=moto_endpoint)
    sink.check_writable(RECORD_SCHEMA)
    assert sink.root.count("/") == 0


def test_an_endpoint_without_a_scheme_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "localhost:9000")
    with pytest.raises(SinkError, match="S3 endpoint 'localhost:9000' is not an http:// or https:// URL"):
        ParquetSink.from_uri("s3://bucket/dataset")


class S3ErrorServer:
    """An S3 endpoint on loopback that answers every request with one S3 error."""

    def __init__(self, status: int, code: str) -> None:
        body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected</Message></Error>"

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body.encode())

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = answer

            def log_message(self, *arguments: object) -> None:
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.address = f"{LOOPBACK}:{self._server.server_port}"

    def __enter__(self) -> S3ErrorServer:
        # A short poll interval: shutdown() waits for the next poll.
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def single_attempt_sink(address: str) -> ParquetSink:
    """A sink whose S3 client tries once, so that a failure shows at once instead of after retries."""
    filesystem = pafs.S3FileSystem(
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
        scheme="http",
        endpoint_override=address,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    return ParquetSink("s3://bucket/dataset", filesystem, "bucket/dataset")


S3_ERRORS = [
    pytest.param(503, "SlowDown", True, id="503-slow-down"),
    pytest.param(500, "InternalError", True, id="500-internal-error"),
    pytest.param(503, "ServiceUnavailable", True, id="503-service-unavailable"),
    pytest.param(403, "AccessDenied", False, id="403-access-denied"),
    pytest.param(404, "NoSuchBucket", False, id="404-no-such-bucket"),
    pytest.param(400, "InvalidRequest", False, id="400-invalid-request"),
]


@pytest.mark.parametrize(("status", "code", "retryable"), S3_ERRORS)
def test_an_s3_failure_is_retryable_exactly_when_the_storage_may_recover(status: int, code: str, retryable: bool):
    with S3ErrorServer(status, code) as server:
        sink = single_attempt_sink(server.address)
        with pytest.raises(SinkError) as staged:
            sink.stage(batch_range(position("1"), position("2")), rows(1, 2), "attempt-0")
        with pytest.raises(SinkError) as read:
            sink.read_dataset()
    assert (staged.value.retryable, read.value.retryable) == (retryable, retryable)
    assert staged.value.uri == "s3://bucket/dataset"


def test_an_unreachable_s3_endpoint_is_a_retryable_sink_error() -> None:
    sink = single_attempt_sink(f"{LOOPBACK}:{free_port()}")
    with pytest.raises(SinkError, match="NETWORK_CONNECTION") as raised:
        sink.exists("stream_name=orders/shard_id=x/1-0_2-0.parquet")
    assert raised.value.retryable


def test_an_s3_sink_needs_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(variable)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SinkError, match="no AWS credentials"):
        ParquetSink.from_uri("s3://bucket/dataset", s3_endpoint_url="http://127.0.0.1:1")


def test_a_sink_survives_pickling_as_it_must_to_reach_an_executor(tmp_path) -> None:
    sink = ParquetSink.from_uri(str(tmp_path))
    publish_batch(sink, 1, 2)
    copy: ParquetSink = pickle.loads(pickle.dumps(sink))
    assert (copy.uri, copy.root) == (sink.uri, sink.root)
    assert sequence_numbers(copy.read_dataset()) == [1, 2]
