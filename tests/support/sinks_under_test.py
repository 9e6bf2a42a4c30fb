"""The sinks the exactly-once tests run over, each behind the same few steps in behavioural terms
(`SinkUnderTest`): a Parquet dataset, whose slots make each batch visible right after its commit, and
an Iceberg table and a Delta table (local and on S3), whose driver makes a round's batches visible at
the round's end. A test that takes
the `sink_under_test` fixture runs against every one of them, its id the sink's name. What readers of
a table see is read twice, with the library that wrote it and with DuckDB, and must be the same."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import boto3
import pytest
from pyiceberg.expressions import EqualTo

from devtools.analyst_reads import AnalystTable
from lease_core.store.lease_store import LeaseStore
from sinks.batch_sink import BatchSink, RoundIdentity, RoundPublication, Visibility
from sinks.dead_lettering import DeadLetteringSink, dead_letter_uri
from sinks.errors import SinkError
from sinks.parquet import ParquetSink
from sinks.table.delta import DeltaLeaseRecord, DeltaSink
from sinks.table.iceberg import IcebergSink, LeaseRecord, StagedBatchGone
from spark_jobs.round_publication import publish_committed_batches
from spark_jobs.round_report import Publication
from tests.support.iceberg_tables import URI, faulty_catalog, table_sequence_numbers

APPLICATION = "app"
STREAM = "stream"
STREAM_ARN = f"arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}"


class SinkUnderTest(Protocol):
    name: str

    @property
    def family(self) -> str:
        """The sink's kind, whose answers a test expects wherever it is stored ("delta" for "delta-s3")."""

    def sink(self) -> BatchSink:
        """The sink as a new process opens it (a slot's, the driver's), its storage healthy."""

    def visibility_failing(self) -> BatchSink:
        """The sink while making batches visible fails, all round long: a Parquet promotion (an S3 503
        on every CopyObject), an Iceberg round's commit (the catalog cannot be reached to commit)."""

    def remove_staged(self, record: str | None) -> None:
        """Delete the staged data of the committed batches a lease's `record` names, behind the sink's
        back (a lifecycle rule, an orphan-file cleanup): a Parquet staged file, an Iceberg receipt and
        its manifest."""

    def remove_visible_rows(self, shard_id: str) -> None:
        """Delete the rows of the shard readers see, behind the sink's back (retention, compaction)."""

    def visible_sequence_numbers(self) -> list[str]:
        """The sequence numbers of the rows readers see, in order."""

    def dead_letter_sink(self) -> BatchSink:
        """The dead-letter destination beside the sink, as a new process opens it."""

    def dead_letter_rows(self) -> list[dict[str, Any]]:
        """The dead letters readers see, every column."""

    def dead_letters_visibility_failing(self) -> BatchSink:
        """The dead-letter destination while making its batches visible fails (as `visibility_failing`)."""


def end_round(sink: BatchSink, store: LeaseStore, round_number: int) -> tuple[Publication, tuple[str, ...]]:
    """The round's last step as the consume job's driver takes it for every sink (`consume_job.publish`):
    every committed batch the lease table names made visible. A dataset's finishes what a slot's
    promotion left; a table's is the round's one commit."""
    identity = RoundIdentity(APPLICATION, round_number, {STREAM: (STREAM_ARN, 1_764_000_000)})
    return publish_committed_batches(sink, identity, store.list_leases())


class StagedDataGone:
    """`sink`, except that the staged data of the committed batches is deleted right before each of its
    visibility steps (the slot's after a commit, the driver's at the round's end)."""

    def __init__(self, sink: BatchSink, remove_staged: Callable[[str | None], None]) -> None:
        self._sink = sink
        self._remove_staged = remove_staged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def make_visible(self, record: str | None) -> Visibility:
        self._remove_staged(record)
        return self._sink.make_visible(record)

    def publish_round(self, records: Mapping[str, str], identity: RoundIdentity) -> RoundPublication:
        for record in records.values():
            self._remove_staged(record)
        return self._sink.publish_round(records, identity)


class PromotionFails(ParquetSink):
    """The dataset while every promotion fails as the storage's does (an S3 503 on the CopyObject)."""

    def _promote(self, staged: str, visible: str) -> Visibility:
        raise SinkError(self.uri, f"cannot promote {staged}: injected: the promotion failed", retryable=True)


@dataclass(frozen=True)
class ParquetUnderTest:
    root: Path
    name: str = "parquet"
    family: str = "parquet"

    def sink(self) -> ParquetSink:
        return ParquetSink.from_uri(str(self.root))

    def visibility_failing(self) -> BatchSink:
        healthy = self.sink()
        return PromotionFails(healthy.uri, healthy.filesystem, healthy.root)

    def remove_staged(self, record: str | None) -> None:
        if record is not None:
            (self.root / record).unlink(missing_ok=True)

    def remove_visible_rows(self, shard_id: str) -> None:
        for visible in self.root.glob(f"stream_name=*/shard_id={shard_id}/[!_]*.parquet"):
            visible.unlink()

    def visible_sequence_numbers(self) -> list[str]:
        return sorted(self.sink().read_dataset().column("sequence_number").to_pylist(), key=int)

    def dead_letter_sink(self) -> ParquetSink:
        return ParquetSink.from_uri(dead_letter_uri(str(self.root)))

    def dead_letters_visibility_failing(self) -> BatchSink:
        healthy = self.dead_letter_sink()
        return PromotionFails(healthy.uri, healthy.filesystem, healthy.root)

    def dead_letter_rows(self) -> list[dict[str, Any]]:
        if not Path(dead_letter_uri(str(self.root))).exists():
            return []
        return self.dead_letter_sink().read_dataset().to_pylist()


@dataclass(frozen=True)
class IcebergUnderTest:
    """A table of a SQL catalog on SQLite; each sink opens the catalog anew, as another process does."""

    tmp_path: Path
    name: str = "iceberg"
    family: str = "iceberg"

    def sink(self) -> IcebergSink:
        return IcebergSink(URI, APPLICATION, catalog=faulty_catalog(self.tmp_path))

    def visibility_failing(self) -> BatchSink:
        catalog = faulty_catalog(self.tmp_path)
        catalog.refuse_commits = True
        return IcebergSink(URI, APPLICATION, catalog=catalog)

    def remove_staged(self, record: str | None) -> None:
        decoded = LeaseRecord.decode(record)
        sink = self.sink()
        table = sink.table()
        if decoded is None or table is None:
            return
        for entry in decoded.entries:
            try:
                receipt = sink.read_receipt(entry.receipt, table)
            except StagedBatchGone:
                continue
            if receipt.manifest_path is not None:
                table.io.delete(receipt.manifest_path)
            table.io.delete(sink.receipt_path(table, entry.receipt))

    def remove_visible_rows(self, shard_id: str) -> None:
        table = self.sink().table()
        assert table is not None
        table.delete(EqualTo("shard_id", shard_id))

    def visible_sequence_numbers(self) -> list[str]:
        sink = self.sink()
        table = sink.table(refresh=True)
        if table is None:
            return []
        return as_duckdb_reads(table_sequence_numbers(sink), AnalystTable.iceberg(table.metadata_location))

    def dead_letter_sink(self) -> IcebergSink:
        return IcebergSink(dead_letter_uri(URI), APPLICATION, catalog=faulty_catalog(self.tmp_path))

    def dead_letters_visibility_failing(self) -> BatchSink:
        catalog = faulty_catalog(self.tmp_path)
        catalog.refuse_commits = True
        return IcebergSink(dead_letter_uri(URI), APPLICATION, catalog=catalog)

    def dead_letter_rows(self) -> list[dict[str, Any]]:
        table = self.dead_letter_sink().table(refresh=True)
        return [] if table is None else table.scan().to_arrow().to_pylist()


def as_duckdb_reads(numbers: list[str], table: AnalystTable) -> list[str]:
    """`numbers`, the sequence numbers the table's own library reads, once DuckDB has read the same."""
    read = sorted(table.rows(["sequence_number"]).column("sequence_number").to_pylist(), key=int)
    assert read == numbers, f"DuckDB reads {read} from {table.location}, the library that wrote it {numbers}"
    assert table.count() == len(numbers)
    return numbers


def dead_letters(under: SinkUnderTest) -> list[tuple[str, str]]:
    """The dead letters readers see beside the sink, as (sequence number, error), in order."""
    rows = under.dead_letter_rows()
    return sorted(((row["sequence_number"], row["error"]) for row in rows), key=lambda row: int(row[0]))


def round_sink(under: SinkUnderTest, *, dead_letters: bool = True, output: BatchSink | None = None) -> BatchSink:
    """The sink a round drives (`sinks.open_round_sink`): `output` (the healthy sink by
    default), with the dead-letter destination beside it."""
    return DeadLetteringSink(output or under.sink(), "dead letters", under.dead_letter_sink, enabled=dead_letters)


class DeltaCommitRefused(DeltaSink):
    """The table while every commit of a round fails (the storage refuses the log entry)."""

    def _commit(self, *args: Any, **kwargs: Any) -> None:
        raise SinkError(self.uri, "injected: the Delta log cannot be written to commit", retryable=True)


@dataclass(frozen=True)
class DeltaUnderTest:
    """A Delta table in a local folder ("delta") or under an S3 prefix on moto ("delta-s3"); each sink
    opens it anew, as another process does."""

    uri: str
    name: str = "delta"
    s3_endpoint_url: str | None = None
    family: str = "delta"

    def sink(self) -> DeltaSink:
        return self.open(self.uri)

    def open(self, uri: str, kind: type[DeltaSink] = DeltaSink) -> DeltaSink:
        return kind(uri, APPLICATION, s3_endpoint_url=self.s3_endpoint_url)

    def visibility_failing(self) -> BatchSink:
        return self.open(self.uri, DeltaCommitRefused)

    def remove_staged(self, record: str | None) -> None:
        decoded = DeltaLeaseRecord.decode(record)
        sink = self.sink()
        for entry in decoded.entries if decoded is not None else ():
            sink.storage.delete([sink.receipt_path(entry.receipt)])

    def remove_visible_rows(self, shard_id: str) -> None:
        table = self.sink().table()
        assert table is not None
        table.delete(f"shard_id = '{shard_id}'")

    def visible_sequence_numbers(self) -> list[str]:
        sink = self.sink()
        numbers = sorted((row["sequence_number"] for row in _delta_rows(sink)), key=int)
        if sink.table() is None:
            return numbers
        return as_duckdb_reads(numbers, AnalystTable.delta(sink.location, self.s3_endpoint_url))

    def dead_letter_sink(self) -> DeltaSink:
        return self.open(dead_letter_uri(self.uri))

    def dead_letters_visibility_failing(self) -> BatchSink:
        return self.open(dead_letter_uri(self.uri), DeltaCommitRefused)

    def dead_letter_rows(self) -> list[dict[str, Any]]:
        return _delta_rows(self.dead_letter_sink())


def delta_on_moto(request: pytest.FixtureRequest, tmp_path: Path) -> DeltaUnderTest:
    """A Delta table under a prefix of a bucket of its own on the session's moto server."""
    endpoint = request.getfixturevalue("moto_endpoint")
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return DeltaUnderTest(f"delta:s3://{bucket}/orders", "delta-s3", endpoint)


def _delta_rows(sink: DeltaSink) -> list[dict[str, Any]]:
    """The rows readers of the table see, with the stream and shard columns."""
    rows = sink.visible_rows()
    return [] if rows is None else rows.to_pylist()


SINKS_UNDER_TEST: dict[str, Callable[[pytest.FixtureRequest, Path], SinkUnderTest]] = {
    "parquet": lambda request, tmp_path: ParquetUnderTest(tmp_path / "lake"),
    "iceberg": lambda request, tmp_path: IcebergUnderTest(tmp_path),
    "delta": lambda request, tmp_path: DeltaUnderTest(f"delta:{tmp_path / 'lake'}"),
    "delta-s3": delta_on_moto,
}


@pytest.fixture(params=sorted(SINKS_UNDER_TEST))
def sink_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    return SINKS_UNDER_TEST[request.param](request, tmp_path)
